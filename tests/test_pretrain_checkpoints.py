"""REALM pre-training checkpoints: complete-or-absent checkpoint folders, resume after `kill -9` on the recorded index
version, protected index versions, model cards and the Hub upload."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import TINY_PRETRAIN, pretrain_argv, setup_refresh
from huggingface_hub import ModelCard
from transformers import AutoTokenizer
from transformers.trainer_utils import get_last_checkpoint

from openrealm import RealmEmbedder, RealmKnowledgeAugEncoder, RealmScorer
from openrealm.hub_cards.model_card import realm_model_card
from openrealm.trainers import checkpoints
from openrealm.trainers.cli import main as openrealm_main
from openrealm.trainers.indexing import list_versions
from openrealm.trainers.pretraining import trainer

KILL_TIMEOUT = 90  # seconds for the first run to write checkpoint-4 (imports + index v0 + 4 steps)


def run_argv(corpus_dir: Path, output: Path, max_steps: int) -> list[str]:
    """`train pretrain`'s options: tiny towers, a sync refresh and a checkpoint every 2 steps (the newest 2 kept)."""
    extra = ["--max-steps", str(max_steps), "--batch-size", "4", "--logging-steps", "1"]
    extra += ["--save-steps", "2", "--save-total-limit", "2"]
    return pretrain_argv(corpus_dir, output, *extra, refresh_every=2, refresh_mode="sync")


def cli(argv: list[str], **kwargs) -> subprocess.Popen:
    command = [sys.executable, "-m", "openrealm", "train", "pretrain", *argv]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)


def test_resume_after_kill_9_continues_from_the_last_checkpoint_on_its_index_version(world_corpus, tmp_path):
    output = tmp_path / "out"
    # The first run would go on for 1000 steps: it is killed as soon as checkpoint-4 appears.
    first = cli(run_argv(world_corpus, output, 1000))
    deadline = time.monotonic() + KILL_TIMEOUT
    while not (output / "checkpoint-4").is_dir():
        assert first.poll() is None, first.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "no checkpoint-4"
        time.sleep(0.02)
    first.send_signal(signal.SIGKILL)
    first.communicate()
    assert first.returncode == -signal.SIGKILL
    last = Path(get_last_checkpoint(str(output)))
    assert last.name == "checkpoint-4", sorted(os.listdir(output))
    recorded = json.loads((last / "refresh_state.json").read_text())
    assert (recorded["step"], recorded["snapshot_step"]) == (4, 4)
    assert recorded["index_version"] in list_versions(output / "index")

    resumed_argv = [arg for arg in run_argv(world_corpus, output, 6) if arg != "--no-progress"]
    resumed = cli(resumed_argv + ["--resume-from-checkpoint", "last", "--verbose"])  # --verbose: the loss dicts
    stdout = resumed.communicate(timeout=KILL_TIMEOUT)[0]
    assert resumed.returncode == 0, stdout[-3000:]
    assert f"resuming from {last} (step 4, index v{recorded['index_version']})" in stdout
    # The resumed process trained steps 5 and 6 only (one printed loss entry per step), not 1..6 again.
    assert stdout.count("{'loss'") == 2
    summary = json.loads((output / "pretraining.json").read_text())
    logs = {entry["step"]: entry for entry in summary["log_history"] if "loss" in entry}
    assert sorted(logs) == [1, 2, 3, 4, 5, 6]
    # Step 5's batch was collated from the index version checkpoint-4 recorded; the sync refresh at 6 built the next.
    assert logs[5]["batch_index_version"] == recorded["index_version"] == logs[5]["index_version"]
    assert logs[6]["index_version"] == recorded["index_version"] + 1
    assert (output / "checkpoint-6").is_dir()
    assert RealmEmbedder.from_pretrained(output / "embedder").config.hidden_size == 32
    assert RealmKnowledgeAugEncoder.from_pretrained(output / "encoder").config.retriever_proj_size == 16
    assert RealmScorer.from_pretrained(output / "scorer").config.retriever_proj_size == 16


def test_saving_checkpoints_leaves_the_training_losses_unchanged(world_corpus, tmp_path):
    # Writing a checkpoint builds the scorer to save it; its weight initialisation must not draw from the run's
    # random number generators (dropout, masking), or a run that checkpoints trains differently after its first save.
    losses = {}
    for name, argv in (("saving", run_argv(world_corpus, tmp_path / "saving", 4)), ("not", None)):
        if argv is None:
            argv = run_argv(world_corpus, tmp_path / name, 4)
            argv = argv[: argv.index("--save-steps")]
        run = cli(argv)
        output = run.communicate(timeout=KILL_TIMEOUT)[0]
        assert run.returncode == 0, output[-3000:]
        history = json.loads((tmp_path / name / "pretraining.json").read_text())["log_history"]
        losses[name] = [entry["loss"] for entry in history if "loss" in entry]
    assert (tmp_path / "saving" / "checkpoint-4").is_dir()
    assert len(losses["saving"]) == 4 and losses["saving"] == losses["not"]


def test_half_written_checkpoint_is_not_picked_for_resume(tmp_path):
    output = tmp_path / "out"
    complete = output / "checkpoint-4"
    complete.mkdir(parents=True)
    (complete / "refresh_state.json").write_text(json.dumps({"index_version": 2, "step": 4}))
    (complete / "trainer_state.json").write_text(json.dumps({"global_step": 4}))
    # What a kill during the save of step 6 leaves: the staging folder, never a checkpoint-6 without its state.
    staging = output / ".staging-checkpoint-6" / "checkpoint-6"
    staging.mkdir(parents=True)
    (staging / "optimizer.pt").write_bytes(b"partial")
    assert checkpoints.resolve_resume("last", output, trainer.CHECKPOINT_FILES) == complete
    checkpoints.remove_stale_staging(output)
    assert sorted(os.listdir(output)) == ["checkpoint-4"]


def test_checkpoint_folder_without_refresh_state_is_rejected(tmp_path):
    (tmp_path / "checkpoint-2").mkdir()
    (tmp_path / "checkpoint-2" / "trainer_state.json").write_text(json.dumps({"global_step": 2}))
    with pytest.raises(FileNotFoundError, match="is not a whole checkpoint: it has no refresh_state.json"):
        checkpoints.resolve_resume(str(tmp_path / "checkpoint-2"), tmp_path, trainer.CHECKPOINT_FILES)


def test_pruning_keeps_the_index_versions_kept_checkpoints_use(world_corpus, tmp_path):
    embedder, _, callback = setup_refresh(world_corpus, tmp_path / "index", "sync", refresh_every=1)
    callback.protected_versions = {0}
    for step in range(1, 5):
        callback.refresh_sync(embedder, step)
    assert list_versions(tmp_path / "index") == [0, 2, 3, 4]
    callback.protected_versions = set()
    assert callback.prune_versions() == [0]


def test_checkpoint_state_round_trips_into_a_fresh_callback(world_corpus, tmp_path):
    embedder, _, callback = setup_refresh(world_corpus, tmp_path / "index", "sync", refresh_every=2)
    callback.refresh_sync(embedder, 2)
    state = json.loads(json.dumps(callback.checkpoint_state()))
    _, examples, fresh = setup_refresh(world_corpus, tmp_path / "index2", "sync", refresh_every=2)
    fresh.restore(state, callback.examples.query_embedder, callback.examples.index)
    assert (examples.index.version, fresh.snapshot_step, fresh.last_build_step) == (1, 2, 2)
    assert fresh.metrics(3)["index_staleness_steps"] == 1 and fresh.builds_started == 1


SUMMARY = {
    "corpus": "/data/wiki-corpus",
    "num_blocks": 1234,
    "max_steps": 200,
    "batch_size": 16,
    "learning_rate": 3e-5,
    "refresh_mode": "async",
    "refresh_every": 50,
    "final": {"retrieval_utility": 0.3125, "null_doc_prob": 0.25, "index_version": 4},
    "train_loss": 4.875,
}


def test_model_card_has_metadata_sections_and_the_summary_numbers():
    card = ModelCard(str(realm_model_card("scorer", SUMMARY, datasets=["wikipedia"])))
    metadata = yaml.safe_load(str(card).split("---")[1])
    assert metadata["license"] == "apache-2.0" and metadata["datasets"] == ["wikipedia"]
    assert {"realm", "retrieval-augmented", "pre-training"} <= set(metadata["tags"])
    assert card.data.library_name == "transformers"
    for section in ("Model description", "Training corpus", "Training", "Intended use", "Limitations", "Citation"):
        assert f"## {section}\n" in card.text, section
    for fact in ("RealmScorer", "wiki-corpus", "blocks: 1234", "steps: 200", "batch size: 16", "async every 50"):
        assert fact in card.text, fact
    for metric in ("MLM loss: 4.875", "retrieval utility: 0.3125", "index version: 4"):
        assert metric in card.text, metric
    assert "Guu, Kelvin and Lee, Kenton and Tung, Zora and Pasupat, Panupong and Chang, Ming-Wei" in card.text


def test_model_card_rejects_an_unknown_kind():
    with pytest.raises(ValueError, match="kind"):
        realm_model_card("reader-ish", SUMMARY)


class StandInHfApi:
    """Records create_repo / upload_folder calls and the files each upload would send (no network)."""

    def __init__(self):
        self.repos, self.uploads = [], {}

    def create_repo(self, repo_id, private=False, exist_ok=False):
        self.repos.append(repo_id)

    def upload_folder(self, repo_id, folder_path, commit_message=None):
        folder = Path(folder_path)
        self.uploads[repo_id] = {str(p.relative_to(folder)): p.read_text(errors="replace") for p in folder.rglob("*")}


def test_push_to_hub_uploads_the_three_folders_with_cards_holding_the_metrics(world_corpus, tmp_path, monkeypatch):
    api = StandInHfApi()
    monkeypatch.setattr("huggingface_hub.HfApi", lambda: api)
    output = tmp_path / "out"
    argv = ["--corpus", str(world_corpus), "--embedder", "random", "--encoder", "random", "--output", str(output)]
    argv += ["--max-steps", "2", "--refresh-every", "2", "--refresh-mode", "off", "--batch-size", "4"]
    argv += ["--logging-steps", "1", "--config-overrides", TINY_PRETRAIN, "--no-progress"]
    argv += ["--push-to-hub", "me/realm-tiny"]
    assert openrealm_main(["train", "pretrain", *argv]) == 0
    assert api.repos == ["me/realm-tiny-embedder", "me/realm-tiny-encoder", "me/realm-tiny-scorer"]
    summary = json.loads((output / "pretraining.json").read_text())
    last_log = [entry for entry in summary["log_history"] if "loss" in entry][-1]  # logged every step: the final one
    for repo, files in api.uploads.items():
        assert {"README.md", "config.json", "model.safetensors", "tokenizer.json"} <= set(files), repo
        card = files["README.md"]
        assert f"MLM loss: {last_log['loss']:.4g}" in card and "index version: 0" in card
        assert f"retrieval utility: {last_log['retrieval_utility']:.4g}" in card
        assert "steps: 2" in card and f"blocks: {summary['num_blocks']}" in card
    assert "RealmScorer" in api.uploads["me/realm-tiny-scorer"]["README.md"]
    assert (
        AutoTokenizer.from_pretrained(output / "scorer").get_vocab()
        == AutoTokenizer.from_pretrained(world_corpus).get_vocab()
    )
