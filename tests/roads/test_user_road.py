"""A user's whole road through the CLI, with its defaults, from a BERT checkpoint laid out as bert-base-uncased ships
(`bert.*` keys of BertForMaskedLM, a BERT tokenizer, 128 positions: fewer than the defaults' 288 / 384):

    corpus build -> train ict -> index build -> train pretrain (kill -9, resume) -> train openqa -> evaluate -> push
    -> pipeline("question-answering") from the pushed folder in a fresh process.

At every hand-off the next stage must have loaded exactly the weights the previous one saved: each load of a REALM
model is recorded (no missing key; every saved tensor equal to the loaded one).
"""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import RecordingHfApi
from safetensors.torch import load_file
from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast
from transformers.trainer_utils import get_last_checkpoint

from openrealm import RealmPreTrainedModel
from openrealm.tokenization.vocab import train_wordpiece_vocab
from openrealm.trainers import towers
from openrealm.trainers.cli import main
from openrealm.trainers.world.synthetic_world import generate_world

WORLD = {
    "num_people": 16,
    "num_organizations": 4,
    "num_cities": 4,
    "num_rivers": 2,
    "num_mountains": 2,
    "num_regions": 2,
}
KILL_TIMEOUT = 120  # seconds for the first pre-training process to write checkpoint-2


def make_bert_checkpoint(world, folder: Path) -> dict[str, torch.Tensor]:
    """A tiny BertForMaskedLM saved as bert-base-uncased is (`bert.*` + `cls.predictions.*`, BertTokenizer files),
    with a WordPiece vocabulary of the world's text. Returns its saved tensors."""
    vocab = train_wordpiece_vocab(world.texts(), folder.parent / "vocab", vocab_size=600)
    tokenizer = BertTokenizerFast(vocab_file=str(folder.parent / "vocab" / "vocab.txt"), do_lower_case=True)
    tokenizer.save_pretrained(folder)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=128,
    )  # fmt: skip
    BertForMaskedLM(config).save_pretrained(folder)
    return load_file(folder / "model.safetensors")


@pytest.fixture
def recorded_loads(monkeypatch):
    """Every REALM model load in this process: (class name, folder, loaded state, missing keys)."""
    loads = []
    original = RealmPreTrainedModel.from_pretrained.__func__

    def recording(cls, path, *args, **kwargs):
        wants_info = kwargs.pop("output_loading_info", False)
        model, info = original(cls, path, *args, output_loading_info=True, **kwargs)
        state = {key: value.detach().clone() for key, value in model.state_dict().items()}
        loads.append((cls.__name__, Path(path).resolve(), state, set(info["missing_keys"])))
        return (model, info) if wants_info else model

    monkeypatch.setattr(RealmPreTrainedModel, "from_pretrained", classmethod(recording))
    return loads


def assert_loaded_as_saved(loads, name: str, folder: Path, rename=lambda key: key, skip=()) -> None:
    """The `name` model loaded from folder holds every tensor of folder/model.safetensors (keys renamed as the loader
    maps them), and nothing was missing."""
    matches = [(state, missing) for cls, path, state, missing in loads if cls == name and path == folder.resolve()]
    assert matches, f"no {name} was loaded from {folder}: {[(cls, str(path)) for cls, path, _, _ in loads]}"
    state, missing = matches[-1]
    assert missing == set()
    saved = load_file(folder / "model.safetensors")
    compared = 0
    for key, tensor in saved.items():
        if key.startswith(skip):
            continue
        assert torch.equal(state[rename(key)], tensor), key  # exact: loaded from the saved file
        compared += 1
    assert compared >= 20


def run_cli(*argv: str) -> None:
    assert main(list(argv)) == 0


def test_a_user_road_from_a_bert_checkpoint_to_the_pipeline(tmp_path, recorded_loads, monkeypatch):
    world = generate_world(seed=0, **WORLD)
    world.write(tmp_path / "world")
    bert_dir, corpus, ict, index = (tmp_path / name for name in ("bert", "corpus", "ict", "index"))
    pretrain, openqa, results = tmp_path / "pretrain", tmp_path / "openqa", tmp_path / "results.json"
    bert = make_bert_checkpoint(world, bert_dir)
    assert any(key.startswith("bert.encoder.") for key in bert) and "cls.predictions.bias" in bert

    # 1. The corpus, with the BERT's tokenizer and the defaults (the date regex marks salient spans).
    run_cli("corpus", "build", "--input", str(tmp_path / "world" / "articles.jsonl"), "--output", str(corpus),
            "--tokenizer", str(bert_dir))  # fmt: skip
    config = json.loads((corpus / "corpus_config.json").read_text())
    assert config["max_block_length"] == 288

    # 2. ICT from the BERT checkpoint: its encoder, not a random one, is what the embedder starts from.
    run_cli("train", "ict", "--corpus", str(corpus), "--init", str(bert_dir), "--output", str(ict),
            "--max-steps", "3", "--batch-size", "8", "--save-steps", "3", "--no-progress")  # fmt: skip
    name, path, state, missing = recorded_loads[0]
    assert (name, path) == ("RealmEmbedder", bert_dir.resolve()) and missing == set()
    for key, tensor in bert.items():
        if key.startswith("bert."):
            assert torch.equal(state["realm." + key[len("bert.") :]], tensor), key  # exact: copied from BERT
    assert json.loads((ict / "ict_training.json").read_text())["block_seq_len"] == 128  # lowered from 288
    # Its last checkpoint (the whole IctModel) holds the embedder it saved.
    from_checkpoint = towers.load_embedder(ict / "checkpoint-3").state_dict()
    # exact: both saved from the same weights, reloaded
    assert all(torch.equal(from_checkpoint[key], value) for key, value in load_file(ict / "model.safetensors").items())

    # 3. An index of the ICT embedder.
    run_cli("index", "build", "--embedder", str(ict), "--corpus", str(corpus), "--output", str(index), "--quiet")
    assert_loaded_as_saved(recorded_loads, "RealmEmbedder", ict)

    # 4. REALM pre-training, killed with SIGKILL after its first checkpoint, then resumed.
    argv = ["train", "pretrain", "--corpus", str(corpus), "--embedder", str(ict), "--encoder", str(bert_dir),
            "--index", str(index), "--output", str(pretrain), "--refresh-every", "2", "--save-steps", "2",
            "--batch-size", "4", "--no-progress"]  # fmt: skip
    first = subprocess.Popen(
        [sys.executable, "-m", "openrealm", *argv, "--max-steps", "1000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + KILL_TIMEOUT
    while not (pretrain / "checkpoint-2" / "refresh_state.json").is_file():
        assert first.poll() is None, first.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "no checkpoint-2"
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.communicate()
    assert first.returncode == -signal.SIGKILL
    checkpoint = Path(get_last_checkpoint(str(pretrain)))
    run_cli(*argv, "--max-steps", str(int(checkpoint.name.split("-")[1]) + 2), "--resume-from-checkpoint")
    assert_loaded_as_saved(recorded_loads, "RealmEmbedder", ict)
    assert_loaded_as_saved(
        recorded_loads, "RealmKnowledgeAugEncoder", bert_dir, lambda k: k.replace("bert.", "realm.", 1)
    )
    assert_loaded_as_saved(recorded_loads, "RealmEmbedder", checkpoint / "embedder")
    assert_loaded_as_saved(recorded_loads, "RealmKnowledgeAugEncoder", checkpoint / "encoder")
    summary = json.loads((pretrain / "pretraining.json").read_text())
    assert summary["resumed_from"] == str(checkpoint)

    # 5. Open-QA fine-tuning from the pre-training output.
    run_cli("train", "openqa", "--model", str(pretrain), "--corpus", str(corpus), "--output", str(openqa),
            "--train", str(tmp_path / "world" / "questions_train.jsonl"), "--max-steps", "2",
            "--no-progress")  # fmt: skip
    assert_loaded_as_saved(recorded_loads, "RealmEmbedder", pretrain / "embedder")
    assert_loaded_as_saved(recorded_loads, "RealmKnowledgeAugEncoder", pretrain / "encoder")

    # 6. Evaluation of the saved model.
    run_cli("evaluate", "--model", str(openqa), "--dataset", str(tmp_path / "world" / "questions_test.jsonl"),
            "--output", str(results), "--limit", "4", "--no-progress")  # fmt: skip
    assert_loaded_as_saved(recorded_loads, "RealmForOpenQA", openqa)
    evaluation = json.loads(results.read_text())

    # 7. Push to the (recording) Hub; the repository's files are the folder's.
    api = RecordingHfApi()
    monkeypatch.setattr("huggingface_hub.HfApi", lambda: api)
    run_cli("push", "--model", str(openqa), "--repo-id", "me/realm-road", "--eval-results", str(results))
    hub = tmp_path / "hub" / "me" / "realm-road"
    for relative, content in api.uploads["me/realm-road"].items():
        (hub / relative).parent.mkdir(parents=True, exist_ok=True)
        (hub / relative).write_bytes(content)
    assert (hub / "model.safetensors").read_bytes() == (openqa / "model.safetensors").read_bytes()

    # 8. The pipeline, in a fresh process, from the pushed folder: the weights pushed, the answer evaluated.
    question = evaluation["predictions"][0]["question"]
    # exact (in the script): the pipeline's weights are loaded from the saved file
    script = (
        "import json, sys, torch, openrealm\n"
        "from safetensors.torch import load_file\n"
        "from transformers import pipeline\n"
        "qa = pipeline('question-answering', model=sys.argv[1])\n"
        "saved = load_file(sys.argv[1] + '/model.safetensors')\n"
        "state = qa.model.state_dict()\n"
        "different = [k for k, v in saved.items() if not torch.equal(state[k], v)]\n"
        "print(json.dumps({'different': different, 'answer': qa(sys.argv[2])['answer']}))\n"
    )
    fresh = subprocess.run([sys.executable, "-c", script, str(hub), question], capture_output=True, text=True)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    answer = json.loads(fresh.stdout.strip().splitlines()[-1])
    assert answer["different"] == []
    assert answer["answer"] == evaluation["predictions"][0]["prediction"]
