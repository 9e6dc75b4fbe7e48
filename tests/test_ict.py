"""ICT warm start (ORQA's language/orqa/datasets/ict_dataset.py and models/ict_model.py): examples, the in-batch loss
over the global batch, training with Trainer, recall."""

import json
import os
import socket
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from datasets import Dataset
from helpers import (
    ACCELERATE_ENV,
    BLOCK_TEXTS,
    TITLES,
    accelerate_launch,
    fixture_folder,
    fixture_tokenizer,
    tiny_fields,
    tiny_overrides,
    tiny_realm_config,
    write_corpus,
)
from transformers import AutoTokenizer, BertConfig, BertModel, EvalPrediction

from openrealm import RealmConfig, RealmEmbedder, RealmTokenizer
from openrealm.tokenization.corpus import build_corpus
from openrealm.tokenization.corpus_folder import load_corpus
from openrealm.tokenization.vocab import train_wordpiece_vocab
from openrealm.trainers import ict, towers
from openrealm.trainers.cli import main
from openrealm.trainers.embedding import embed_corpus, embed_queries
from openrealm.trainers.stage_utils import google_warmup_steps, parse_config_overrides
from openrealm.trainers.world.synthetic_world import generate_world

CLS, SEP = 3, 4  # the fixture tokenizer's [CLS] and [SEP]
# A small random embedder, wider and deeper than the tiny towers, that learns ICT in a few hundred CPU steps. Dropout
# is off: with Google's dropout (0.1 in BERT and on the LayerNorm-ed embedding, no temperature) a random tiny model
# does not learn in such a budget.
LEARNER = tiny_overrides(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=256,
    retriever_proj_size=32,
    hidden_dropout_prob=0,
    attention_probs_dropout_prob=0,
    max_position_embeddings=288,
)


def row(title: list[int], *sentences: list[int]) -> dict:
    """A corpus row from wordpiece ids: body = the sentences concatenated, sentence_starts their offsets."""
    starts = np.cumsum([0] + [len(s) for s in sentences[:-1]]).tolist()
    return {"title_ids": title, "token_ids": [i for s in sentences for i in s], "sentence_starts": starts}


def unpadded(batch: dict, name: str, i: int) -> list[int]:
    mask = batch["block_attention_mask" if name.startswith("block") else "query_attention_mask"][i].bool()
    return batch[name][i][mask].tolist()


@pytest.fixture(scope="module")
def ict_corpus(tmp_path_factory) -> Path:
    """The synthetic world (seed 0: 288 articles of 1-18 sentences, one block each) as a knowledge corpus with its own
    WordPiece vocabulary."""
    root = tmp_path_factory.mktemp("world")
    world = generate_world(seed=0)
    vocab = train_wordpiece_vocab(world.texts(), root / "vocab", vocab_size=4000)
    articles = Dataset.from_list([{"title": a["title"], "text": a["text"]} for a in world.articles])
    build_corpus(articles, root / "corpus", vocab)
    return root / "corpus"


@pytest.fixture
def one_thread():
    """Tiny matrices train faster (and identically on any machine) on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def train_args(corpus: Path, output: Path, *extra: str) -> list[str]:
    return [
        "train", "ict", "--corpus", str(corpus), "--init", "random", "--output", str(output), "--batch-size", "8",
        "--config-overrides", LEARNER, "--embedding-dropout", "0", "--no-progress", *extra,
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------------
# Examples
# ---------------------------------------------------------------------------------------------------------------------


def test_query_is_one_sentence_of_the_block_removed_from_it(tokenizer):
    rows = [row([20, 21], [30, 31], [40, 41, 42], [50]), row([22], [60, 61, 62], [70, 71])]
    batch = ict.IctCollator(tokenizer, mask_rate=1.0, seed=0)(rows)
    for i, r in enumerate(rows):
        query = unpadded(batch, "query_input_ids", i)
        sentence = query[1:-1]
        assert query[0] == CLS and query[-1] == SEP
        body = r["token_ids"]
        start = next(s for s in r["sentence_starts"] if body[s : s + len(sentence)] == sentence)
        rest = body[:start] + body[start + len(sentence) :]
        assert unpadded(batch, "block_input_ids", i) == [CLS, *r["title_ids"], SEP, *rest, SEP]
        assert unpadded(batch, "block_token_type_ids", i) == [0] * (len(r["title_ids"]) + 2) + [1] * (len(rest) + 1)
    assert batch["example_mask"].tolist() == [True, True]
    assert batch["sentence_removed"].tolist() == [True, True]


def test_mask_rate_zero_keeps_the_sentence_in_its_block(tokenizer):
    rows = [row([20], [30, 31], [40, 41, 42])]
    batch = ict.IctCollator(tokenizer, mask_rate=0.0, seed=0)(rows)
    assert unpadded(batch, "block_input_ids", 0) == [CLS, 20, SEP, 30, 31, 40, 41, 42, SEP]
    assert unpadded(batch, "query_input_ids", 0)[1:-1] in ([30, 31], [40, 41, 42])
    assert batch["sentence_removed"].tolist() == [False] and batch["example_mask"].tolist() == [True]


def test_removal_from_a_single_sentence_block_drops_the_example(tokenizer):
    rows = [row([20], [30, 31]), row([21], [40], [50])]
    batch = ict.IctCollator(tokenizer, mask_rate=1.0, seed=0)(rows)
    assert batch["example_mask"].tolist() == [False, True]
    assert batch["sentence_removed"].tolist() == [False, True]


def test_sentences_are_chosen_uniformly_and_removed_at_mask_rate_from_the_seed(tokenizer):
    rows = [row([20], [30], [40], [50])] * 3000
    batch = ict.IctCollator(tokenizer, mask_rate=0.9, seed=0)(rows)
    chosen = batch["query_input_ids"][:, 1]
    for token in (30, 40, 50):
        assert abs((chosen == token).float().mean().item() - 1 / 3) < 0.03
    assert abs(batch["sentence_removed"].float().mean().item() - 0.9) < 0.02
    again = ict.IctCollator(tokenizer, mask_rate=0.9, seed=0)(rows)
    other = ict.IctCollator(tokenizer, mask_rate=0.9, seed=1)(rows)
    assert torch.equal(again["query_input_ids"], batch["query_input_ids"])
    assert not torch.equal(other["query_input_ids"], batch["query_input_ids"])


def test_query_and_block_are_truncated_to_their_lengths(tokenizer):
    long_sentence = list(range(10, 110))
    rows = [row(list(range(10, 310)), long_sentence, [7, 8])]
    batch = ict.IctCollator(tokenizer, mask_rate=0.0, seed=1)(rows)
    query = unpadded(batch, "query_input_ids", 0)
    assert len(query) <= 64 and query[-1] == SEP
    assert query[1:-1] in (long_sentence[:62], [7, 8])
    # The title is cut first, to 288 - 3: no room is left for the body.
    assert unpadded(batch, "block_input_ids", 0) == [CLS, *range(10, 295), SEP, SEP]


def test_eval_examples_are_fixed_once(tokenizer):
    blocks = Dataset.from_list([row([20 + i], [30 + i], [40 + i], [50 + i]) for i in range(40)])
    examples = ict.fixed_eval_examples(blocks, 30, mask_rate=0.9, seed=0)
    first = ict.IctCollator(tokenizer, seed=0)(list(examples))
    second = ict.IctCollator(tokenizer, seed=1)(list(examples))
    assert len(examples) == 30
    assert torch.equal(first["query_input_ids"], second["query_input_ids"])
    assert torch.equal(first["block_input_ids"], second["block_input_ids"])
    assert first["sentence_removed"].tolist() == examples["remove_sentence"]


# ---------------------------------------------------------------------------------------------------------------------
# Loss over the global batch
# ---------------------------------------------------------------------------------------------------------------------


def test_loss_is_softmax_cross_entropy_with_the_own_block_as_target():
    generator = torch.Generator().manual_seed(0)
    query, blocks = torch.randn(5, 8, generator=generator), torch.randn(5, 8, generator=generator)
    loss, logits, correct = ict.in_batch_softmax_loss(query, blocks)
    torch.testing.assert_close(logits, query @ blocks.T)
    torch.testing.assert_close(loss, F.cross_entropy(query @ blocks.T, torch.arange(5)))
    assert correct.tolist() == ((query @ blocks.T).argmax(1) == torch.arange(5)).tolist()


def test_dropped_examples_are_neither_queries_nor_negatives():
    generator = torch.Generator().manual_seed(0)
    query, blocks = torch.randn(5, 8, generator=generator), torch.randn(5, 8, generator=generator)
    keep = torch.tensor([True, False, True, True, False])
    loss, _, correct = ict.in_batch_softmax_loss(query, blocks, keep)
    expected = F.cross_entropy(query[keep] @ blocks[keep].T, torch.arange(3))
    torch.testing.assert_close(loss, expected)
    assert not correct[~keep].any()


def _two_process_worker(rank: int, port: int, out_dir: str, legacy_gather: bool) -> None:
    """One of two gloo processes: its rows of a batch shared by seed; writes its loss, logits and gradients."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as functional_collectives

    torch.set_num_threads(1)  # no OpenMP thread pool in a forked child
    if legacy_gather:  # a torch without functional collectives: torch.distributed.nn.functional.all_gather
        del functional_collectives.all_gather_single_autograd
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    generator = torch.Generator().manual_seed(0)
    query, blocks = torch.randn(6, 8, generator=generator), torch.randn(6, 8, generator=generator)
    results = {}
    for name, rows in SPLITS.items():
        q = query[rows[rank]].clone().requires_grad_(True)
        b = blocks[rows[rank]].clone().requires_grad_(True)
        loss, logits, _ = ict.in_batch_softmax_loss(q, b)
        loss.backward()
        results[name] = {"loss": loss.item(), "logits": logits.tolist(), "q_grad": q.grad.tolist(),
                         "b_grad": b.grad.tolist()}  # fmt: skip
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


SPLITS = {"equal": [slice(0, 3), slice(3, 6)], "unequal": [slice(0, 4), slice(4, 6)]}  # rows of each process


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("legacy_gather", [False, True], ids=["functional-collectives", "legacy-all-gather"])
def test_two_processes_score_every_query_against_both_processes_blocks(tmp_path, legacy_gather):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # fork: the workers inherit this process's imports instead of paying seconds to import openrealm again.
    torch.multiprocessing.start_processes(
        _two_process_worker, args=(port, str(tmp_path), legacy_gather), nprocs=2, join=True, start_method="fork"
    )
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    generator = torch.Generator().manual_seed(0)
    query, blocks = torch.randn(6, 8, generator=generator), torch.randn(6, 8, generator=generator)
    for name, rows in SPLITS.items():
        # One process over the global batch; DDP averages the processes' gradients, i.e. the mean of their losses.
        q, b = query.clone().requires_grad_(True), blocks.clone().requires_grad_(True)
        losses = [F.cross_entropy(q[r] @ b.T, torch.arange(6)[r]) for r in rows]
        (sum(losses) / 2).backward()
        for rank, r in enumerate(rows):
            got = ranks[rank][name]
            assert torch.tensor(got["logits"]).shape == (r.stop - r.start, 6)  # both processes' blocks as columns
            torch.testing.assert_close(torch.tensor(got["logits"]), (query[r] @ blocks.T))
            assert got["loss"] == pytest.approx(losses[rank].item(), rel=1e-5)
            torch.testing.assert_close(torch.tensor(got["q_grad"]) / 2, q.grad[r])
            torch.testing.assert_close(torch.tensor(got["b_grad"]) / 2, b.grad[r])


# ---------------------------------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------------------------------


def tiny_embedder(seed: int = 0) -> RealmEmbedder:
    torch.manual_seed(seed)
    return RealmEmbedder(RealmConfig(vocab_size=158, **tiny_fields(intermediate_size=37)))


def test_ict_model_wraps_the_embedder_unchanged_and_freezes_only_its_mlm_head():
    embedder = tiny_embedder()
    before = {name: p.detach().clone() for name, p in embedder.state_dict().items()}
    model = ict.IctModel(embedder.config, embedder)
    assert model.embedder is embedder
    for name, tensor in embedder.state_dict().items():
        assert torch.equal(tensor, before[name]), name  # exact: the same tensors, untouched
    frozen = {name for name, p in embedder.named_parameters() if not p.requires_grad}
    assert frozen and all(name.startswith("cls.predictions.") for name in frozen)
    assert embedder.cls.dense.weight.requires_grad and embedder.realm.pooler.dense.weight.requires_grad


def test_embedding_dropout_acts_only_in_training(tokenizer):
    embedder = tiny_embedder()
    model = ict.IctModel(embedder.config, embedder, embedding_dropout=0.5)
    ids = torch.tensor([[CLS, 20, 21, SEP]])
    mask = torch.ones_like(ids)
    plain = embedder.eval()(ids, attention_mask=mask).projected_score
    torch.testing.assert_close(model.eval().embed(ids, mask), plain)
    assert (model.train().embed(ids, mask) == 0).any()


def test_metrics_split_accuracy_by_whether_the_sentence_was_removed():
    correct = np.array([1.0, 0.0, 1.0, 1.0, 0.0])
    removed = np.array([True, True, False, True, False])
    valid = np.array([True, True, True, True, False])
    metrics = ict.compute_ict_metrics(EvalPrediction(predictions=correct, label_ids=(removed, valid)))
    assert metrics == {"accuracy": 0.75, "removed_accuracy": 2 / 3, "kept_accuracy": 1.0}


def test_google_warmup_formula():
    assert [google_warmup_steps(n) for n in (50, 5000, 200_000)] == [100, 500, 10000]


# ---------------------------------------------------------------------------------------------------------------------
# Initialisation
# ---------------------------------------------------------------------------------------------------------------------


def test_blocks_removed_from_the_corpus_are_neither_queries_nor_negatives(tmp_path):
    from openrealm.trainers.living_corpus import edit_corpus

    corpus = write_corpus(tmp_path / "corpus")  # 7 blocks, two of them titled "paris"
    edit_corpus(corpus, remove_titles=["paris"], progress=False)
    blocks = ict.load_blocks(corpus)
    assert blocks["block_id"] == [0, 2, 3, 4, 6]


def test_init_from_a_bert_checkpoint_loads_its_encoder(ict_corpus, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(ict_corpus)
    torch.manual_seed(0)
    bert = BertModel(
        BertConfig(vocab_size=len(tokenizer), **tiny_fields(intermediate_size=37, retriever_proj_size=None))
    )
    bert.save_pretrained(tmp_path / "bert")
    embedder = towers.load_embedder(str(tmp_path / "bert"), tokenizer, {"retriever_proj_size": 16})
    torch.testing.assert_close(
        embedder.realm.encoder.layer[0].output.dense.weight, bert.encoder.layer[0].output.dense.weight
    )
    assert embedder.config.retriever_proj_size == 16
    towers.check_tokenizer(embedder, tokenizer, str(tmp_path / "bert"), "--init")


def test_a_model_with_another_vocabulary_is_refused(ict_corpus, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(ict_corpus)
    other = fixture_folder("embedder", "safetensors")  # a RealmEmbedder with its own 158-token vocabulary
    embedder = towers.load_embedder(str(other), tokenizer)
    with pytest.raises(ValueError, match="embeds only 158"):
        towers.check_tokenizer(embedder, tokenizer, str(other), "--init")
    small = fixture_tokenizer()
    same_size = towers.load_embedder("random", small, {"hidden_size": 32, "num_attention_heads": 2})
    same_size.save_pretrained(tmp_path / "own")
    AutoTokenizer.from_pretrained(ict_corpus).save_pretrained(tmp_path / "own")
    with pytest.raises(ValueError, match="vocabulary differs"):
        towers.check_tokenizer(same_size, small, str(tmp_path / "own"), "--init")


def test_a_default_sequence_length_is_lowered_to_what_the_model_reads():
    embedder = RealmEmbedder(tiny_realm_config(max_position_embeddings=64))
    assert towers.fit_length(embedder, 288, "--init m", "--block-seq-len") == 64
    assert towers.fit_length(embedder, 32, "--init m", "--block-seq-len") == 32


def test_a_sequence_length_the_user_chose_beyond_the_model_is_refused_naming_the_flag():
    embedder = RealmEmbedder(tiny_realm_config(max_position_embeddings=64))
    with pytest.raises(ValueError, match="reads at most 64 positions .* pass --block-seq-len 64"):
        towers.fit_length(embedder, 288, "--init m", "--block-seq-len", explicit=True)


# ---------------------------------------------------------------------------------------------------------------------
# Retrieval evaluation
# ---------------------------------------------------------------------------------------------------------------------


def test_recall_matches_a_brute_force_ranking(ict_corpus, one_thread):
    tokenizer = AutoTokenizer.from_pretrained(ict_corpus)
    embedder = towers.load_embedder("random", tokenizer, parse_config_overrides(LEARNER), seed=0)
    blocks = load_corpus(ict_corpus)
    result = ict.evaluate_retrieval(embedder, ict_corpus, tokenizer, num_queries=100, k=5, seed=3)

    own, queries, removed = ict.sample_sentence_queries(blocks, 100, 3, tokenizer)
    query_emb = embed_queries(embedder, *ict.pad_rows(queries, tokenizer.pad_token_id)).cpu()
    scores = query_emb @ embed_corpus(embedder, blocks, tokenizer).T
    rank_kept = (scores > scores.gather(1, own[:, None])).sum(1)
    positions = torch.tensor(removed.pop("position"))
    own_removed = (query_emb[positions] * embed_corpus(embedder, Dataset.from_dict(removed), tokenizer)).sum(1)
    others = scores[positions].scatter(1, own[positions][:, None], float("-inf"))
    rank_removed = (others >= own_removed[:, None]).sum(1)
    assert result["num_blocks"] == len(blocks) and result["num_queries"] == 100
    assert result["num_queries_removed"] == len(positions)
    assert result["recall_sentence_kept"] == pytest.approx((rank_kept < 5).float().mean().item())
    assert result["recall_sentence_removed"] == pytest.approx((rank_removed < 5).float().mean().item())
    assert result["chance"] == pytest.approx(5 / len(blocks))


# ---------------------------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------------------------


def test_train_ict_saves_a_loadable_embedder_and_resumes(ict_corpus, tmp_path, one_thread, capsys, monkeypatch):
    pushed = []
    monkeypatch.setattr(RealmEmbedder, "push_to_hub", lambda self, repo, **kwargs: pushed.append(("model", repo)))
    monkeypatch.setattr(RealmTokenizer, "push_to_hub", lambda self, repo, **kwargs: pushed.append(("tokenizer", repo)))
    output = tmp_path / "ict"
    extra = ["--warmup-steps", "1", "--save-steps", "2", "--eval-steps", "2", "--eval-blocks", "16"]
    first = ["--max-steps", "2", "--eval-queries", "20", "--push-to-hub", "me/ict"]
    assert main([*train_args(ict_corpus, output, *first, *extra)]) == 0
    embedder = RealmEmbedder.from_pretrained(output)
    assert embedder.config.hidden_size == 64 and embedder.config.retriever_proj_size == 32
    assert AutoTokenizer.from_pretrained(output).get_vocab() == AutoTokenizer.from_pretrained(ict_corpus).get_vocab()
    summary = json.loads((output / "ict_training.json").read_text())
    assert summary["global_batch_size"] == 8 and summary["max_steps"] == 2
    assert summary["retrieval"]["num_queries"] == 20 and summary["retrieval"]["num_blocks"] == len(
        load_corpus(ict_corpus)
    )
    printed = capsys.readouterr().out.splitlines()[-1]
    assert printed.startswith(f"ICT: saved the RealmEmbedder to {output} (train loss ")
    assert "in-batch accuracy " in printed and "recall@5 of the query's block " in printed
    assert pushed == [("model", "me/ict"), ("tokenizer", "me/ict")]

    capsys.readouterr()
    assert main([*train_args(ict_corpus, output, "--max-steps", "4", *extra)]) == 2  # bad input: exit 2
    assert f"openrealm: error: output folder {output} is not empty" in capsys.readouterr().err
    assert main([*train_args(ict_corpus, output, "--max-steps", "4", *extra, "--resume-from-checkpoint")]) == 0
    state = json.loads((output / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["global_step"] == 4 and state["log_history"][0]["step"] == 2  # the first run's evaluation
    # exact: any change at all means the run trained
    assert not torch.equal(RealmEmbedder.from_pretrained(output).cls.dense.weight, embedder.cls.dense.weight)


@pytest.mark.slow
def test_two_processes_under_accelerate_train_on_global_batches(ict_corpus, tmp_path):
    command = [
        *accelerate_launch(), "-m", "openrealm",
        *train_args(ict_corpus, tmp_path / "ict", "--max-steps", "2", "--warmup-steps", "1", "--save-steps", "0"),
    ]  # fmt: skip
    env = {**os.environ, **ACCELERATE_ENV}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "ict" / "ict_training.json").read_text())
    assert summary["global_batch_size"] == 16  # 8 per process: each query met 15 negatives
    assert result.stdout.count("ICT: saved") == 1  # only the main process writes
    RealmEmbedder.from_pretrained(tmp_path / "ict")


@pytest.mark.slow
def test_ict_on_the_synthetic_world_finds_a_sentences_own_block(ict_corpus, tmp_path, one_thread):
    """From a small random model, ICT raises the recall@5 of a sentence's own block among the world's 288 blocks
    from chance (5/288 = 0.017) to far above it. Measured (sentence kept / removed from its block): untrained 0.031 /
    0.008, trained 0.82 / 0.89 with this seed; over training seeds 0-4 untrained <= 0.04, trained 0.81-0.86 /
    0.89-0.92 (another world, seed 1: 0.79-0.83 / 0.85-0.88)."""
    tokenizer = AutoTokenizer.from_pretrained(ict_corpus)
    untrained = towers.load_embedder("random", tokenizer, parse_config_overrides(LEARNER), seed=0)
    before = ict.evaluate_retrieval(untrained, ict_corpus, tokenizer, num_queries=288, k=5, seed=0)
    steps = ["--max-steps", "120", "--batch-size", "32", "--learning-rate", "1e-3", "--warmup-steps", "12"]
    args = train_args(ict_corpus, tmp_path / "ict", *steps, "--save-steps", "0", "--logging-steps", "40")
    assert main(args) == 0
    trained = RealmEmbedder.from_pretrained(tmp_path / "ict")
    after = ict.evaluate_retrieval(trained, ict_corpus, tokenizer, num_queries=288, k=5, seed=0)

    assert after["chance"] < 0.05  # at least 100 blocks to choose from (seed 0: 288)
    assert before["recall_sentence_kept"] < 0.1 and before["recall_sentence_removed"] < 0.1
    assert after["recall_sentence_kept"] > 0.6
    assert after["recall_sentence_removed"] > 0.6


def one_sentence_corpus(directory: Path) -> Path:
    """Six blocks of one sentence each (the fixture tokenizer's BLOCK_TEXTS)."""
    return write_corpus(directory, titles=TITLES[:6], texts=BLOCK_TEXTS)


def test_ict_refuses_a_corpus_whose_every_example_would_be_dropped_before_loading_the_model(tmp_path, capsys):
    corpus = one_sentence_corpus(tmp_path / "corpus")
    output = tmp_path / "ict"
    argv = train_args(corpus, output, "--max-steps", "2", "--batch-size", "2", "--mask-rate", "1")
    assert main(argv) == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith(
        "openrealm: error: 6 of 6 examples an epoch (100%) give no training example: 6 because their block holds a "
        "single sentence, which ICT removes from it with probability --mask-rate 1"
    )
    assert "(6 of the 6 blocks hold one sentence)" in error and "lower --mask-rate" in error
    assert "more than --max-dropped-share 0.9" in error and not output.exists()


def test_ict_summary_line_warns_when_most_examples_are_dropped(tmp_path, capsys):
    corpus = one_sentence_corpus(tmp_path / "corpus")
    output = tmp_path / "ict"
    steps = ["--max-steps", "2", "--batch-size", "6", "--mask-rate", "0.6", "--save-steps", "0"]
    assert main(train_args(corpus, output, *steps)) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith(f"ICT: saved the RealmEmbedder to {output} (train loss ")
    assert "; warning: 4 of 6 examples an epoch (67%) give no training example: 4 because their block holds" in line


def test_ict_whose_loss_is_exactly_zero_at_every_step_fails_and_saves_no_model(tmp_path, capsys):
    corpus = one_sentence_corpus(tmp_path / "corpus")
    output = tmp_path / "ict"
    # 5 of 6 examples dropped on average: under --max-dropped-share 0.9, but no step of batch 2 keeps two queries
    assert main(train_args(corpus, output, "--max-steps", "1", "--batch-size", "2", "--save-steps", "0")) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "openrealm: error: train ict trained nothing: its loss was exactly 0 at each of its 1 step(s), as no query "
        "had another block of its batch to be scored against. About 5 of the 6 examples an epoch (83%) are dropped "
        "(a block of one sentence loses it with probability --mask-rate 0.9), and a dropped example leaves the loss, "
        "as query and as block. Use articles of several sentences per block, a lower --mask-rate or a larger "
        "--batch-size. No model was saved."
    )
    assert not (output / "model.safetensors").exists()


@pytest.mark.parametrize("num_blocks, batch_size", [(1, 1), (6, 1)])
def test_ict_refuses_a_global_batch_of_one_block_whose_loss_is_always_zero(tmp_path, capsys, num_blocks, batch_size):
    texts = [" ".join(BLOCK_TEXTS[i:] + BLOCK_TEXTS[:i]) for i in range(num_blocks)]  # six sentences each
    corpus = write_corpus(tmp_path / "corpus", titles=TITLES[:num_blocks], texts=texts)
    argv = train_args(corpus, tmp_path / "ict", "--max-steps", "1", "--batch-size", str(batch_size))
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert f"(--batch-size {batch_size} x 1 processes; corpus {corpus} has {num_blocks} blocks)" in error
    assert "a batch of one block has none, its loss is 0 and nothing trains" in error
