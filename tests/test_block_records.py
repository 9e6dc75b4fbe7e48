"""Tests for openrealm.block_records: the safetensors block records and the safe legacy .npy reader."""

import json
import os
import pickle
import random
import struct
import subprocess

import numpy as np
import pytest
import torch
from safetensors import safe_open

from openrealm import block_records
from openrealm.block_records import (
    BlockRecords,
    LegacyBlockRecordsError,
    convert_legacy_block_records,
    iter_legacy_block_records,
    read_legacy_block_records,
)

RECORDS = [("Ålesund", "Fjord town ☃ with 日本語"), ("", ""), ("Title only", ""), ("", "text only 🚀"), ("a", "b")]
LEGACY = [b"first block", b"", b"", "caf\u00e9 \u2603".encode(), b"x" * 3000, b"a", b"a"]


def write_records(tmp_path, records=RECORDS):
    return BlockRecords.write(tmp_path / "block_records.safetensors", records)


def header_of(path):
    """(header dict, byte position where the data section starts) of a safetensors file."""
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + length]), 8 + length


def rewrite_header(path, header):
    """Replace the header of a safetensors file, keeping its data section."""
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    new = json.dumps(header).encode()
    new += b" " * (-len(new) % 8)
    path.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + length :])


def patch_bytes(path, position, data):
    raw = bytearray(path.read_bytes())
    raw[position : position + len(data)] = data
    path.write_bytes(bytes(raw))


def save_legacy(path, array, protocol=None):
    """np.save-like .npy file; with `protocol`, pickle.dump the array after a header written here."""
    if protocol is None:
        np.save(path, array, allow_pickle=True)
        return path
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, np.lib.format.header_data_from_array_1_0(array))
        pickle.dump(array, f, protocol=protocol)
    return path


def raw_legacy(path, pickle_bytes, shape=(1,)):
    """A .npy file with an object-array header for `shape` followed by arbitrary pickle bytes (its header is 128
    bytes long, so pickle position p is byte 128 + p of the file)."""
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "|O", "fortran_order": False, "shape": shape})
        f.write(pickle_bytes)
    return path


def object_array(values):
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array


class Evil:
    """Pickles as a call of `func(*args)`: what np.load(allow_pickle=True) would execute."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def create_file_code(sentinel):
    return f"open({str(sentinel)!r}, 'w').close()"


# --- BlockRecords -------------------------------------------------------------------------------------------------


def test_write_then_open_roundtrips_unicode_and_empty_strings(tmp_path):
    write_records(tmp_path)
    records = BlockRecords.open(tmp_path / "block_records.safetensors")
    assert len(records) == len(RECORDS)
    assert [(records.title(i), records.text(i)) for i in range(len(records))] == RECORDS


def test_write_returns_the_opened_records(tmp_path):
    records = write_records(tmp_path)
    assert isinstance(records, BlockRecords)
    assert records.texts(range(len(RECORDS))) == [text for _, text in RECORDS]


def test_record_returns_title_and_text(tmp_path):
    records = write_records(tmp_path)
    assert records.record(0) == {"title": "Ålesund", "text": "Fjord town ☃ with 日本語"}
    assert records.record(1) == {"title": "", "text": ""}


def test_getitem_returns_the_text_bytes_as_the_4x_object_array_did(tmp_path):
    records = write_records(tmp_path)
    assert records[0] == "Fjord town ☃ with 日本語".encode()
    assert records[-2] == "text only 🚀".encode()
    assert list(records) == [text.encode() for _, text in RECORDS]


def test_fancy_indexing_returns_a_numpy_object_array_of_bytes(tmp_path):
    records = write_records(tmp_path)
    picked = records[np.array([[4, 0], [3, 4]])]
    assert picked.dtype == object and picked.shape == (2, 2)
    assert picked.tolist() == [[b"b", RECORDS[0][1].encode()], [RECORDS[3][1].encode(), b"b"]]
    assert records[[4, 1]].tolist() == [b"b", b""]
    assert records[3:].tolist() == [RECORDS[3][1].encode(), b"b"]
    assert records[np.array([False, False, False, True, True])].tolist() == [RECORDS[3][1].encode(), b"b"]


def test_getitem_out_of_range_raises_index_error_like_numpy(tmp_path):
    records = write_records(tmp_path)
    with pytest.raises(IndexError, match=r"index 5 is out of bounds for 5 block records"):
        records[5]
    with pytest.raises(IndexError, match=r"index -6 is out of bounds for 5 block records"):
        records[[0, -6]]


def test_write_accepts_dicts_and_bytes(tmp_path):
    records = BlockRecords.write(
        tmp_path / "r.safetensors", [{"title": "t", "text": "x"}, {"title": b"b\xc3\xa9", "text": "é".encode()}]
    )
    assert [records.record(0), records.record(1)] == [{"title": "t", "text": "x"}, {"title": "bé", "text": "é"}]


def test_text_bytes_returns_raw_utf8(tmp_path):
    records = write_records(tmp_path)
    assert records.text_bytes(0) == "Fjord town ☃ with 日本語".encode()
    assert records.text_bytes(1) == b""


def test_texts_flattens_a_2d_torch_tensor(tmp_path):
    records = write_records(tmp_path)
    assert records.texts(torch.tensor([[0, 3], [4, 0]])) == [RECORDS[0][1], RECORDS[3][1], "b", RECORDS[0][1]]


def test_texts_and_titles_accept_a_numpy_array(tmp_path):
    records = write_records(tmp_path)
    ids = np.array([4, 2], dtype=np.int32)
    assert records.texts(ids) == ["b", ""]
    assert records.titles(ids) == ["a", "Title only"]


def test_out_of_range_id_raises_index_error_naming_id_and_size(tmp_path):
    records = write_records(tmp_path)
    with pytest.raises(IndexError, match=r"block id 5 is out of range for 5 blocks"):
        records.text(5)
    with pytest.raises(IndexError, match=r"block id -1 is out of range for 5 blocks"):
        records.texts(torch.tensor([0, -1]))


def test_float_ids_are_refused(tmp_path):
    records = write_records(tmp_path)
    with pytest.raises(TypeError, match="integers"):
        records.texts(np.array([0.0, 1.0]))


def test_write_refuses_invalid_utf8_naming_the_block_index(tmp_path):
    path = tmp_path / "r.safetensors"
    with pytest.raises(ValueError, match=r"text of block 2 .* not valid UTF-8 \(at byte 1\)"):
        BlockRecords.write(path, [("a", "b"), ("c", "d"), ("e", b"x\xffy")])
    assert os.listdir(tmp_path) == []


def test_write_with_wrong_num_blocks_hint_fails_without_output(tmp_path):
    with pytest.raises(ValueError, match="expected 3 blocks .* held 2"):
        BlockRecords.write(tmp_path / "r.safetensors", [("a", "b"), ("c", "d")], num_blocks_hint=3)
    assert os.listdir(tmp_path) == []


def test_write_of_no_records_gives_an_empty_corpus(tmp_path):
    records = BlockRecords.write(tmp_path / "r.safetensors", [])
    assert len(records) == 0
    assert records.texts([]) == []


def test_failing_record_iterator_leaves_no_file_and_no_temp_files(tmp_path):
    def records():
        yield ("a", "b")
        yield ("c", "d")
        raise RuntimeError("source broke")

    with pytest.raises(RuntimeError, match="source broke"):
        BlockRecords.write(tmp_path / "r.safetensors", records())
    assert os.listdir(tmp_path) == []


def test_failing_write_keeps_the_previous_file_intact(tmp_path):
    write_records(tmp_path)
    before = (tmp_path / "block_records.safetensors").read_bytes()

    def records():
        yield ("new", "record")
        raise RuntimeError("source broke")

    with pytest.raises(RuntimeError):
        BlockRecords.write(tmp_path / "block_records.safetensors", records())
    assert (tmp_path / "block_records.safetensors").read_bytes() == before
    assert os.listdir(tmp_path) == ["block_records.safetensors"]


def test_safe_open_reads_the_written_file(tmp_path):
    write_records(tmp_path, [("ab", "xyz"), ("", "é")])
    with safe_open(str(tmp_path / "block_records.safetensors"), framework="pt") as f:
        assert f.metadata() == {"format": "openrealm.block_records", "format_version": "1", "num_blocks": "2"}
        assert f.get_tensor("title_offsets").tolist() == [0, 2, 2]
        assert f.get_tensor("text_offsets").tolist() == [0, 3, 5]
        assert bytes(f.get_tensor("title_bytes").tolist()) == b"ab"
        assert bytes(f.get_tensor("text_bytes").tolist()) == "xyzé".encode()
        assert f.get_tensor("text_bytes").dtype == torch.uint8
        assert f.get_tensor("text_offsets").dtype == torch.int64


def test_buffers_are_read_only_memory_maps(tmp_path):
    records = write_records(tmp_path, [("t", "x" * 1_000_000)])
    for buffer in (records._text_bytes, records._title_bytes, records._text_offsets, records._title_offsets):
        assert isinstance(buffer, np.memmap)
        assert not buffer.flags.writeable


def test_open_missing_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.safetensors"):
        BlockRecords.open(tmp_path / "missing.safetensors")


def test_open_truncated_file_names_the_file(tmp_path):
    write_records(tmp_path)
    path = tmp_path / "block_records.safetensors"
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(ValueError, match=rf"{path}.*truncated"):
        BlockRecords.open(path)


def test_open_file_shorter_than_a_header_names_the_file(tmp_path):
    path = tmp_path / "block_records.safetensors"
    path.write_bytes(b"\x01\x02")
    with pytest.raises(ValueError, match=rf"{path}.*too short"):
        BlockRecords.open(path)


def test_open_wrong_format_tag_names_the_file(tmp_path):
    write_records(tmp_path)
    path = tmp_path / "block_records.safetensors"
    header, _ = header_of(path)
    header["__metadata__"]["format"] = "something.else"
    rewrite_header(path, header)
    with pytest.raises(ValueError, match=rf"{path}.*'something.else'"):
        BlockRecords.open(path)


def test_open_wrong_dtype_names_the_file(tmp_path):
    write_records(tmp_path)
    path = tmp_path / "block_records.safetensors"
    header, _ = header_of(path)
    header["text_bytes"]["dtype"] = "I8"
    rewrite_header(path, header)
    with pytest.raises(ValueError, match=rf"{path}.*text_bytes has dtype 'I8'"):
        BlockRecords.open(path)


def test_open_decreasing_offsets_names_the_file_and_block(tmp_path):
    write_records(tmp_path, [("", "aa"), ("", "bb"), ("", "cc")])
    path = tmp_path / "block_records.safetensors"
    header, data_start = header_of(path)
    offsets_at = data_start + header["text_offsets"]["data_offsets"][0]
    patch_bytes(path, offsets_at + 8 * 2, struct.pack("<q", 1))  # text_offsets [0, 2, 4, 6] -> [0, 2, 1, 6]
    with pytest.raises(ValueError, match=rf"{path} is corrupt: text_offsets decrease at block 1"):
        BlockRecords.open(path)


def test_open_last_offset_not_matching_byte_length_names_the_file(tmp_path):
    write_records(tmp_path, [("", "aa"), ("", "bb")])
    path = tmp_path / "block_records.safetensors"
    header, data_start = header_of(path)
    offsets_at = data_start + header["text_offsets"]["data_offsets"][0]
    patch_bytes(path, offsets_at + 8 * 2, struct.pack("<q", 3))
    with pytest.raises(ValueError, match=rf"{path} is corrupt: text_offsets run from 0 to 3, expected 0 to 4"):
        BlockRecords.open(path)


def test_reading_invalid_utf8_names_block_file_and_byte_offset(tmp_path):
    write_records(tmp_path, [("", "ok"), ("", "abc")])
    path = tmp_path / "block_records.safetensors"
    header, data_start = header_of(path)
    bad_at = data_start + header["text_bytes"]["data_offsets"][0] + 3  # second byte of block 1's text
    patch_bytes(path, bad_at, b"\xff")
    records = BlockRecords.open(path)
    assert records.text(0) == "ok"
    with pytest.raises(ValueError, match=rf"text of block 1 of {path} \(byte {bad_at} of the file\)"):
        records.text(1)


# --- legacy block_records.npy ------------------------------------------------------------------------------------


def test_legacy_np_save_file_roundtrips_to_the_exact_bytes(tmp_path):
    path = save_legacy(tmp_path / "block_records.npy", object_array(LEGACY))
    assert read_legacy_block_records(path) == LEGACY


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_legacy_pickle_protocols_read_correctly(tmp_path, protocol):
    path = save_legacy(tmp_path / "block_records.npy", object_array(LEGACY), protocol=protocol)
    assert read_legacy_block_records(path) == LEGACY


def test_legacy_numpy1_module_name_is_accepted(tmp_path):
    path = save_legacy(tmp_path / "block_records.npy", object_array([b"a", b"bc"]), protocol=3)
    raw = path.read_bytes().replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    path.write_bytes(raw)
    assert read_legacy_block_records(path) == [b"a", b"bc"]


def test_legacy_empty_array_reads_as_empty_list(tmp_path):
    path = save_legacy(tmp_path / "block_records.npy", object_array([]))
    assert read_legacy_block_records(path) == []


def test_legacy_batches_have_the_requested_size(tmp_path):
    elements = [f"block {i}".encode() for i in range(2500)]
    path = save_legacy(tmp_path / "block_records.npy", object_array(elements))
    batches = list(iter_legacy_block_records(path, batch_size=700))
    assert [len(batch) for batch in batches] == [700, 700, 700, 400]
    assert [element for batch in batches for element in batch] == elements


def test_legacy_hand_made_os_system_global_is_refused_without_running(tmp_path):
    sentinel = tmp_path / "pwned"
    command = f"touch {sentinel}".encode()
    payload = b"\x80\x02cos\nsystem\nX" + struct.pack("<I", len(command)) + command + b"\x85R."
    path = raw_legacy(tmp_path / "block_records.npy", payload)
    with pytest.raises(LegacyBlockRecordsError, match=rf"refused global os\.system at byte {128 + 2} of {path}"):
        read_legacy_block_records(path)
    assert not sentinel.exists()


def test_legacy_malicious_payload_is_live_under_real_unpickling(tmp_path):
    # Control for the refusal tests below: the same kind of payload does create the sentinel when unpickled.
    sentinel = tmp_path / "pwned"
    pickle.loads(pickle.dumps(Evil(eval, create_file_code(sentinel)), protocol=4))
    assert sentinel.exists()


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_legacy_builtins_eval_is_refused_without_running(tmp_path, protocol):
    sentinel = tmp_path / "pwned"
    path = raw_legacy(tmp_path / "block_records.npy", pickle.dumps(Evil(eval, create_file_code(sentinel)), protocol))
    with pytest.raises(
        LegacyBlockRecordsError, match=rf"refused global (builtins|__builtin__)\.eval at byte \d+ of {path}"
    ):
        read_legacy_block_records(path)
    assert not sentinel.exists()


@pytest.mark.parametrize("protocol", [3, 4])
def test_legacy_subprocess_call_is_refused_without_running(tmp_path, protocol):
    sentinel = tmp_path / "pwned"
    payload = pickle.dumps(Evil(subprocess.call, ["touch", str(sentinel)]), protocol)
    path = raw_legacy(tmp_path / "block_records.npy", payload)
    with pytest.raises(LegacyBlockRecordsError, match=rf"refused global subprocess\.call at byte \d+ of {path}"):
        read_legacy_block_records(path)
    assert not sentinel.exists()


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_legacy_reduce_object_inside_the_element_list_is_refused(tmp_path, protocol):
    sentinel = tmp_path / "pwned"
    array = object_array([b"fine", Evil(eval, create_file_code(sentinel)), b"also fine"])
    path = save_legacy(tmp_path / "block_records.npy", array, protocol=protocol)
    with pytest.raises(LegacyBlockRecordsError, match=rf"refused global .*eval at byte \d+ of {path}"):
        read_legacy_block_records(path)
    assert not sentinel.exists()


def test_legacy_reduce_of_whitelisted_name_with_other_arguments_is_refused(tmp_path):
    # numpy.dtype is whitelisted, but only as dtype("O8", False, True).
    payload = b"\x80\x03cnumpy\ndtype\nX\x02\x00\x00\x00f4\x89\x88\x87R."
    path = raw_legacy(tmp_path / "block_records.npy", payload)
    with pytest.raises(
        LegacyBlockRecordsError,
        match=rf"refused call of <dtype> with arguments \('f4', False, True\) at byte {128 + 25} of {path}",
    ):
        read_legacy_block_records(path)


def test_legacy_persistent_id_opcode_is_refused(tmp_path):
    path = raw_legacy(tmp_path / "block_records.npy", b"\x80\x03X\x01\x00\x00\x00aQ.")
    with pytest.raises(LegacyBlockRecordsError, match=rf"refused opcode BINPERSID at byte {128 + 8} of {path}"):
        read_legacy_block_records(path)


@pytest.mark.parametrize("element", ["a str", 7, bytearray(b"bytearray")], ids=["str", "int", "bytearray"])
def test_legacy_non_bytes_elements_are_refused(tmp_path, element):
    path = save_legacy(tmp_path / "block_records.npy", object_array([b"ok", element]), protocol=5)
    with pytest.raises(LegacyBlockRecordsError, match=rf"refused .* of {path}"):
        read_legacy_block_records(path)


def test_legacy_str_element_error_names_its_index_and_type(tmp_path):
    path = save_legacy(tmp_path / "block_records.npy", object_array([b"ok", b"ok", "a str"]))
    with pytest.raises(
        LegacyBlockRecordsError, match=rf"refused element 2 of type str \(must be bytes\) at byte \d+ of {path}"
    ):
        read_legacy_block_records(path)


def test_legacy_2d_object_array_is_refused(tmp_path):
    array = np.empty((2, 2), dtype=object)
    array[:] = [[b"a", b"b"], [b"c", b"d"]]
    path = save_legacy(tmp_path / "block_records.npy", array)
    with pytest.raises(LegacyBlockRecordsError, match=rf"{path} holds an array of shape \(2, 2\), expected a 1-D"):
        read_legacy_block_records(path)


def test_legacy_2d_shape_inside_the_pickle_is_refused(tmp_path):
    array = np.empty((1, 2), dtype=object)
    array[:] = [[b"a", b"b"]]
    path = raw_legacy(tmp_path / "block_records.npy", pickle.dumps(array, protocol=3), shape=(2,))
    with pytest.raises(
        LegacyBlockRecordsError, match=rf"refused array of shape \(1, 2\) \(must be 1-D\) at byte \d+ of {path}"
    ):
        read_legacy_block_records(path)


def test_legacy_float32_npy_is_refused_with_a_clear_message(tmp_path):
    path = tmp_path / "block_records.npy"
    np.save(path, np.zeros(4, dtype=np.float32))
    with pytest.raises(LegacyBlockRecordsError, match=rf"{path} holds a float32 array, .* object array of bytes"):
        read_legacy_block_records(path)


def test_legacy_truncated_file_is_refused(tmp_path):
    path = save_legacy(tmp_path / "block_records.npy", object_array(LEGACY))
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(LegacyBlockRecordsError, match=rf"{path} holds a damaged pickle stream .*truncated"):
        read_legacy_block_records(path)


def test_legacy_missing_stop_is_refused(tmp_path):
    path = save_legacy(tmp_path / "block_records.npy", object_array(LEGACY))
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(LegacyBlockRecordsError, match=rf"{path} holds a damaged pickle stream"):
        read_legacy_block_records(path)


def test_legacy_trailing_garbage_is_refused(tmp_path):
    path = save_legacy(tmp_path / "block_records.npy", object_array(LEGACY))
    path.write_bytes(path.read_bytes() + b"junk")
    with pytest.raises(LegacyBlockRecordsError, match=rf"{path} has 4 bytes of trailing data"):
        read_legacy_block_records(path)


def test_legacy_element_count_must_match_the_npy_header(tmp_path):
    payload = pickle.dumps(object_array([b"a", b"b", b"c"]), protocol=4)
    path = raw_legacy(tmp_path / "block_records.npy", payload, shape=(2,))
    with pytest.raises(
        LegacyBlockRecordsError, match=rf"element 2 beyond the 2 the .npy header declares .* of {path}"
    ):
        read_legacy_block_records(path)


def test_legacy_error_is_a_value_error(tmp_path):
    path = tmp_path / "block_records.npy"
    path.write_bytes(b"not an npy file at all")
    with pytest.raises(ValueError, match=rf"{path} is not a readable .npy file"):
        read_legacy_block_records(path)


@pytest.mark.parametrize(
    "header",
    [b"{'descr': '|O', 'fortran_order': False, 'shape': (3,), 'x': " + b"'" * 3, b"{'descr': '|O', 'shape': (3L,"],
)
def test_legacy_npy_header_that_does_not_tokenize_is_named_as_unreadable(tmp_path, header):
    # numpy's parser tokenizes an old-style header: an unterminated string or bracket raised tokenize.TokenError.
    padded = header + b" " * ((64 - (10 + len(header) + 1) % 64) % 64) + b"\n"
    path = tmp_path / "block_records.npy"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(padded).to_bytes(2, "little") + padded)
    with pytest.raises(LegacyBlockRecordsError, match=rf"{path} is not a readable .npy file"):
        read_legacy_block_records(path)


def test_convert_legacy_gives_equal_records_with_empty_titles(tmp_path):
    elements = [b"one", "t\u00e9l\u00e9phone".encode(), b"", b"last"]
    npy = save_legacy(tmp_path / "block_records.npy", object_array(elements))
    records = convert_legacy_block_records(npy, tmp_path / "block_records.safetensors")
    assert BlockRecords.open(tmp_path / "block_records.safetensors").texts(range(4)) == [
        "one",
        "téléphone",
        "",
        "last",
    ]
    assert [records.text_bytes(i) for i in range(len(records))] == elements
    assert records.titles(range(4)) == ["", "", "", ""]


def test_convert_legacy_works_with_transformers_progress_bars_turned_off(tmp_path):
    # A user (or `openrealm` without --verbose) may turn transformers' bars off: its tqdm is then a stand-in.
    from transformers.utils import logging as transformers_logging

    elements = [b"one", b"two", b"three"]
    npy = save_legacy(tmp_path / "block_records.npy", object_array(elements))
    transformers_logging.disable_progress_bar()
    try:
        records = convert_legacy_block_records(npy, tmp_path / "block_records.safetensors", progress=True)
    finally:
        transformers_logging.enable_progress_bar()
    assert [records.text_bytes(i) for i in range(len(records))] == elements


def test_legacy_records_are_read_in_one_pass(tmp_path, monkeypatch):
    path = save_legacy(tmp_path / "block_records.npy", object_array(LEGACY))
    passes = []
    original_ops = block_records._ops
    monkeypatch.setattr(block_records, "_ops", lambda *args: passes.append(1) or original_ops(*args))
    assert read_legacy_block_records(path) == LEGACY
    assert len(passes) == 1


def test_an_element_pickled_twice_by_reference_is_read_in_a_second_pass_without_repeats(tmp_path, monkeypatch):
    shared = b"one passage object in two places"
    elements = [f"block {i}".encode() for i in range(1500)]
    elements[10] = elements[1200] = shared  # the pickle fetches it back from its memo, after 1,000 APPENDed
    path = save_legacy(tmp_path / "block_records.npy", object_array(elements), protocol=4)
    second_passes = []
    original = block_records._fetched_memo
    monkeypatch.setattr(block_records, "_fetched_memo", lambda *args: second_passes.append(1) or original(*args))
    batches = list(iter_legacy_block_records(path, batch_size=300))
    assert [element for batch in batches for element in batch] == elements
    assert second_passes == [1]


def test_convert_legacy_writes_the_output_in_place_without_scratch_files(tmp_path, monkeypatch):
    elements = [f"block {i} ".encode() * (i % 7) for i in range(2500)]
    npy = save_legacy(tmp_path / "block_records.npy", object_array(elements))

    def no_scratch(*args, **kwargs):
        raise AssertionError("a scratch file was opened")

    monkeypatch.setattr(block_records.tempfile, "TemporaryFile", no_scratch)
    records = convert_legacy_block_records(npy, tmp_path / "block_records.safetensors")
    assert [records.text_bytes(i) for i in range(len(records))] == elements
    header, data_start = header_of(tmp_path / "block_records.safetensors")
    assert data_start % 8 == 0 and header["text_bytes"]["shape"] == [sum(map(len, elements))]


def test_convert_legacy_shows_progress_over_the_input_bytes(tmp_path, capsys):
    npy = save_legacy(tmp_path / "block_records.npy", object_array([b"x" * 100] * 3 + [b"y"]))
    convert_legacy_block_records(npy, tmp_path / "block_records.safetensors", progress=True)
    assert "Converting: 100%" in capsys.readouterr().err


def test_convert_legacy_leaves_no_output_for_a_malicious_file(tmp_path):
    sentinel = tmp_path / "pwned"
    elements = [f"block {i}".encode() for i in range(30)] + [Evil(eval, create_file_code(sentinel))]
    npy = save_legacy(tmp_path / "block_records.npy", object_array(elements), protocol=4)
    with pytest.raises(LegacyBlockRecordsError, match="eval"):
        convert_legacy_block_records(npy, tmp_path / "block_records.safetensors")
    assert os.listdir(tmp_path) == ["block_records.npy"]


def test_convert_legacy_refuses_non_utf8_text_naming_both_files_and_the_block(tmp_path):
    npy = save_legacy(tmp_path / "block_records.npy", object_array([b"ok", b"\xff\xfe"]))
    with pytest.raises(ValueError, match=rf"converting {npy}: text of block 1 .* not valid UTF-8"):
        convert_legacy_block_records(npy, tmp_path / "block_records.safetensors")
    assert os.listdir(tmp_path) == ["block_records.npy"]


@pytest.mark.parametrize("protocol", [0, 1])
def test_legacy_pickle_protocols_below_2_are_refused(tmp_path, protocol):
    path = save_legacy(tmp_path / "block_records.npy", object_array([b"a"]), protocol=protocol)
    with pytest.raises(LegacyBlockRecordsError, match=rf"refused pickle protocol 0 or 1 at byte \d+ of {path}"):
        read_legacy_block_records(path)


def test_legacy_npy_format_2_header_is_accepted(tmp_path):
    array = object_array([b"a", b"bc"])
    path = tmp_path / "block_records.npy"
    with open(path, "wb") as f:
        np.lib.format.write_array_header_2_0(f, np.lib.format.header_data_from_array_1_0(array))
        pickle.dump(array, f, protocol=4)
    assert read_legacy_block_records(path) == [b"a", b"bc"]


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_legacy_random_corruption_raises_only_legacy_errors(tmp_path, protocol):
    rng = random.Random(protocol)
    path = save_legacy(tmp_path / "block_records.npy", object_array(LEGACY), protocol=protocol)
    original = path.read_bytes()
    with open(path, "rb") as f:
        np.lib.format.read_magic(f)
        np.lib.format.read_array_header_1_0(f)
        pickle_start = f.tell()
    for _ in range(200):
        data = bytearray(original)
        position = rng.randrange(pickle_start, len(data))  # keep the .npy header, damage the pickle
        data[position] = rng.randrange(256)
        path.write_bytes(bytes(data))
        try:
            elements = read_legacy_block_records(path)
        except LegacyBlockRecordsError:
            continue
        assert len(elements) == len(LEGACY) and all(type(element) is bytes for element in elements)


def test_open_a_directory_says_to_pass_the_file(tmp_path):
    with pytest.raises(IsADirectoryError, match=rf"{tmp_path} is a directory"):
        BlockRecords.open(tmp_path)


def test_passage_ids_are_stored_after_the_texts_and_read_back_with_none_for_a_block_without_one(tmp_path):
    triples = [(title, text, passage_id) for (title, text), passage_id in zip(RECORDS, ["7", None, "wiki:9", "", "x"])]
    records = BlockRecords.write(tmp_path / "block_records.safetensors", triples, passage_ids=True)
    assert records.has_passage_ids and records.passage_ids([0, 1, 2, 3, 4]) == ["7", None, "wiki:9", None, "x"]
    assert [records.record(i) for i in range(len(RECORDS))] == [{"title": t, "text": x} for t, x in RECORDS]
    with safe_open(str(tmp_path / "block_records.safetensors"), framework="np") as f:
        assert list(f.keys()) == sorted(
            ["title_offsets", "text_offsets", "passage_id_offsets", "title_bytes", "text_bytes", "passage_id_bytes"]
        )


def test_a_file_without_passage_ids_answers_none_for_each_block(tmp_path):
    records = write_records(tmp_path)
    assert not records.has_passage_ids and records.passage_ids(torch.tensor([[0, 1], [2, 3]])) == [None] * 4


def test_passage_id_offsets_that_disagree_with_the_bytes_are_refused(tmp_path):
    path = tmp_path / "block_records.safetensors"
    BlockRecords.write(path, [("a", "b", "12"), ("c", "d", "3")], passage_ids=True)
    header, data_start = header_of(path)
    start = data_start + header["passage_id_offsets"]["data_offsets"][0]
    patch_bytes(path, start + 16, struct.pack("<q", 1))  # offsets 0, 2, 3 -> 0, 2, 1: the last below the bytes held
    with pytest.raises(ValueError, match="passage_id_offsets run from 0 to 1, expected 0 to 3"):
        BlockRecords.open(path)
