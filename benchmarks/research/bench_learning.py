"""Does REALM pre-training learn on the synthetic world? Refresh on against refresh off, and the controls.

    python benchmarks/research/bench_learning.py --output /tmp/realm-learning [--embedder ict|random]
        [--encoder random|reading-warmup|FOLDER] [--steps 300] [--refresh-every 25]
        [--modes sync,off[,answer-positive][,perfect-reader-marginal]] [--seed 0] [--world num_people=40,...]
        [--embedder-learning-rate LR] [--run-seed 100]

Builds the quickstart's default world (or one resized by `--world`), vocabulary and corpus (64-wordpiece blocks), an
ICT embedder (or a random one) and a random encoder (or the RealmKnowledgeAugEncoder folder given), then runs REALM
pre-training once per refresh mode from the same start, scoring fixed masked queries every `--eval-every` steps with
`evaluate_pretraining`: recall@8 of a block holding the masked span (fresh exact index of the current embedder),
retrieval utility against the null document, MLM accuracy. The paper's claims (§4.5, Table 3 "stale MIPS") are utility
> 0, recall rising far above the initial index's, and less learning with the index never refreshed. Mode
`answer-positive` is the in-batch bound on the retriever: the embedder alone, trained with an answer block of each
query as its positive (the signal a perfect reader would give) against the batch's other positives; mode
`perfect-reader-marginal` is REALM's own objective with a perfect reader and every block a candidate (the blocks
naming a query's names compete, as REALM's top-K candidates do). `--encoder reading-warmup` starts the encoder from
the quickstart's reading warm-up (its "BERT stage"). `--run-seed` repeats a run on the same world and starts with
another data order, masks and held-out split (train pretrain draws its held-out blocks with its own --seed).

Every run's final embedder (and the start's) is also scored as Table 2 scores it: zero-shot retrieval recall@5 on all
of the world's questions (no model saw one), the embedder encoding the question. And once more with the question's
wordpieces that never occur in the corpus ("where", "which", "?"...) left out of the attention mask: no tower ever
trains their embeddings, so they are noise in the question's embedding, and the difference between the two numbers
is how much of a retriever's score is robustness to that noise rather than matching the question's names. Two more
columns separate finding whom a question is about from finding the fact: how often a block naming the question's
subject is in the top 5, and recall@5 with each question asked as a cloze in the corpus's own wording.
Writes OUTPUT/results.json and prints markdown tables for benchmarks/research/.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import shlex
import sys
import time
from pathlib import Path

import torch
import transformers

# Logged by train pretrain at each logging step: how the retriever's softmax and its gradient on answer blocks move.
TRAINING_METRICS = (
    "step",
    "retrieval_entropy",
    "null_doc_prob",
    "answer_in_candidates",
    "answer_posterior_gain",
    "answer_reader_advantage",
    "retrieval_utility",
)
METRICS = (
    "recall@8",
    "retrieval_utility",
    "mlm_accuracy",
    "null_doc_prob",
    "retrieval_entropy",
    "answer_in_candidates",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default="/tmp/openrealm-learning")
    parser.add_argument("--embedder", choices=("ict", "random"), default="ict")
    parser.add_argument(
        "--encoder",
        default="random",
        help="random, reading-warmup (the quickstart's), or a RealmKnowledgeAugEncoder folder",
    )
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--refresh-every", type=int, default=25)
    parser.add_argument(
        "--modes",
        default="sync,off",
        help="refresh modes to compare (sync is deterministic); 'answer-positive' adds the retriever's upper bound",
    )
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--embedder-learning-rate", type=float, help="default: --learning-rate")
    parser.add_argument(
        "--world",
        default="",
        help="generate_world overrides of the quickstart's default world, e.g. num_people=40,num_cities=12",
    )
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0, help="the world's seed, and the run's unless --run-seed")
    parser.add_argument(
        "--run-seed",
        type=int,
        default=None,
        help="train pretrain's --seed (data order, masks) and the held-out blocks' and fixed queries' draws: another "
        "run on the same world, starts and readers (default: --seed)",
    )
    parser.add_argument(
        "--oracle-reader-weight",
        default="0",
        help="train pretrain --oracle-reader-weight, or several (comma-separated): 1 trains the retriever with the "
        "oracle reader alone (default 0)",
    )
    parser.add_argument(
        "--num-candidates", default=None, help="K, null included, or several (comma-separated; default: the preset's)"
    )
    parser.add_argument(
        "--hold-out",
        type=int,
        default=0,
        help="N blocks give no training query; the fixed queries are drawn from them (default 0: from every block)",
    )
    parser.add_argument("--queries-per-block", type=int, default=1, help="fixed queries drawn per block (default 1)")
    parser.add_argument("--recall-k", type=int, default=8, help="k of the fixed queries' recall@k (default 8)")
    parser.add_argument(
        "--starts-from",
        default=None,
        help="an earlier run's OUTPUT of the same --seed and --world: its world, corpus, ICT embedder and reading "
        "warm-up are used instead of building them again",
    )
    parser.add_argument("--pretrain-args", default="", help="more train pretrain flags for every run, e.g. '--x 1'")
    parser.add_argument(
        "--model", default=None, help="RealmConfig overrides of both towers (default: the quickstart's tiny ones)"
    )
    parser.add_argument(
        "--vocab-size", type=int, default=None, help="WordPiece vocabulary (default: the quickstart's)"
    )
    args = parser.parse_args(argv)
    if "--seed" in shlex.split(args.pretrain_args):
        # train pretrain draws its held-out blocks with its --seed: they would no longer be the evaluated ones
        parser.error("--pretrain-args may not set --seed (the held-out split follows it): use --run-seed")
    run_seed = args.seed if args.run_seed is None else args.run_seed

    from transformers import AutoTokenizer

    from openrealm.tokenization.corpus_folder import load_corpus
    from openrealm.trainers.pretraining.evaluation import fixed_masked_queries, held_out_query_blocks
    from openrealm.trainers.quickstart.stages import PRESETS, Stages, share_cpu_cores
    from openrealm.trainers.stage_utils import parse_config_overrides

    share_cpu_cores()
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    world = {**PRESETS["default"].world, **parse_config_overrides(args.world)}
    embedder_lr = args.learning_rate if args.embedder_learning_rate is None else args.embedder_learning_rate
    preset = dataclasses.replace(
        PRESETS["default"],
        world=world,
        pretrain_steps=args.steps,
        refresh_every=args.refresh_every,
        pretrain_batch_size=args.batch_size,
        pretrain_learning_rate=args.learning_rate,
        pretrain_embedder_learning_rate=embedder_lr,
        eval_every=args.eval_every,
        model=args.model or PRESETS["default"].model,
        vocab_size=args.vocab_size or PRESETS["default"].vocab_size,
    )
    stages = Stages(output, preset, args.seed, progress=False)
    if args.starts_from:
        start = Path(args.starts_from)
        world_dir, corpus = start / "world", start / "corpus"
    else:
        world_dir, corpus = output / "world", stages.run("corpus", stages.corpus, stages.run("world", stages.world))
    # A random tower is saved as a folder first, so that a given encoder folder keeps its own sizes.
    if args.starts_from and args.embedder == "ict":
        embedder = str(start / "ict")
    elif args.embedder == "ict":
        embedder = str(stages.run("ICT", stages.ict, corpus))
    else:
        embedder = str(stages.run("initial embedder", stages.initial_tower, corpus, "embedder"))
    if args.encoder == "random":
        encoder = str(stages.run("initial encoder", stages.initial_tower, corpus, "encoder"))
    elif args.encoder == "reading-warmup" and args.starts_from:
        encoder = str(start / "reading-warmup")
    elif args.encoder == "reading-warmup":
        encoder = str(stages.run("reading warm-up", stages.reading_warmup, corpus))
    else:
        encoder = args.encoder
    tokenizer, blocks = AutoTokenizer.from_pretrained(corpus), load_corpus(corpus)
    held_out = held_out_query_blocks(blocks, args.hold_out, run_seed) if args.hold_out else None
    queries = fixed_masked_queries(
        tokenizer,
        blocks,
        num_queries=args.hold_out or preset.eval_queries,
        seed=run_seed + 1,
        block_ids=held_out,
        queries_per_block=args.queries_per_block,
    )
    weights = [float(a) for a in args.oracle_reader_weight.split(",")]
    candidates = (
        [int(k) for k in args.num_candidates.split(",")] if args.num_candidates else [preset.pretrain_num_candidates]
    )
    runs, logs = {}, {}
    modes = args.modes.split(",")
    bounds = {"answer-positive": answer_positive, "perfect-reader-marginal": perfect_reader_marginal}
    settings = [(mode, k, a) for k in candidates for a in weights for mode in modes if mode not in bounds]
    settings += [(mode, None, None) for mode in modes if mode in bounds]
    for mode, num_candidates, weight in settings:
        if mode in bounds:
            runs[mode] = stages.run(
                f"retriever bound {mode}",
                bounds[mode],
                stages,
                corpus,
                embedder,
                queries,
                held_out or [],
                args.recall_k,
            )
            continue
        # One folder per setting, pretrain-MODE-kK-aA (pretrain-MODE when only one K and one oracle weight are given).
        name = mode if len(candidates) * len(weights) == 1 else f"{mode}-k{num_candidates}-a{weight:g}"
        extra = [
            "--oracle-reader-weight",
            str(weight),
            "--hold-out-queries",
            str(args.hold_out),
            "--seed",
            str(run_seed),
        ]
        extra += shlex.split(args.pretrain_args)
        stages.preset = dataclasses.replace(preset, pretrain_num_candidates=num_candidates)
        run = stages.run(
            f"REALM pre-training, refresh {mode}, K = {num_candidates}, oracle weight {weight:g}",
            stages.pretrain,
            corpus,
            embedder,
            encoder,
            mode,
            f"pretrain-{name}",
            args.recall_k,
            extra_argv=extra,
            queries=queries,
        )
        runs[name] = run["history"]
        logged = json.loads(Path(run["summary"]).read_text())["log_history"]
        logs[name] = [{key: entry[key] for key in TRAINING_METRICS if key in entry} for entry in logged]
    embedders = {"start": embedder} | {
        name: str(output / (name if name in bounds else f"pretrain-{name}/embedder")) for name in runs
    }
    zero_shot = {name: zero_shot_recall(folder, corpus, world_dir) for name, folder in embedders.items()}
    zero_shot["bm25"] = bm25_zero_shot_recall(corpus, world_dir)

    results = {
        "command": "python benchmarks/research/bench_learning.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": platform.platform(),
        "cpu_threads": torch.get_num_threads(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "timings_s": stages.timings,
        "starts_from": args.starts_from,
        "run_seed": run_seed,
        "num_fixed_queries": len(queries["uid"]),
        "held_out_blocks": held_out,
        "runs": runs,
        "training_logs": logs,
        "zero_shot_recall_at_5": zero_shot,
    }
    (output / "results.json").write_text(json.dumps(results, indent=2))
    metrics = (f"recall@{args.recall_k}", *METRICS[1:])
    print(f"\n| refresh | step | {' | '.join(metrics)} |\n|---|---|{'---|' * len(metrics)}")
    for mode, history in runs.items():
        for entry in (history[0], history[-1]):
            values = " | ".join(f"{entry.get('eval_' + name, float('nan')):.3f}" for name in metrics)
            print(f"| {mode} | {entry['step']} | {values} |")
    columns = {
        "recall@5": "zero-shot recall@5, all questions",
        "recall@5_test": "held-out (test) questions",
        "recall@5_corpus_wordpieces_only": "all, question-only wordpieces left out",
        "subject_in_top5_test": "test: a block naming the subject in the top 5",
        "recall@5_test_cloze": "test, asked as clozes in the corpus's wording",
    }
    print(f"\n| embedder | {' | '.join(columns.values())} |\n|---|{'---|' * len(columns)}")
    for name, scores in zero_shot.items():
        print(f"| {name} | " + " | ".join(f"{scores.get(key, float('nan')):.1f}" for key in columns) + " |")
    return 0


@torch.no_grad()
def zero_shot_recall(embedder_folder: str, corpus: Path, world: Path, k: int = 5) -> dict[str, float]:
    """Table 2's zero-shot recall@k (%) on every question of the world (an answer string in one of the top k blocks),
    with the whole question, and with the wordpieces that never occur in the corpus left out of the attention mask."""
    from transformers import AutoTokenizer

    from openrealm import RealmEmbedder
    from openrealm.tokenization.corpus_folder import load_corpus
    from openrealm.trainers.embedding import exact_index
    from openrealm.trainers.world.synthetic_world import World

    tokenizer, blocks = AutoTokenizer.from_pretrained(corpus), load_corpus(corpus)
    embedder = RealmEmbedder.from_pretrained(embedder_folder).eval()
    index = exact_index(embedder, blocks, tokenizer)
    generated = World.read(world)
    questions = generated.questions
    texts = blocks["text"]
    corpus_ids = {i for column in ("title_ids", "token_ids") for ids in blocks[column] for i in ids}
    inputs = tokenizer([q["question"] for q in questions], padding=True, return_tensors="pt")
    in_corpus = torch.tensor([[i in corpus_ids for i in row] for row in inputs["input_ids"].tolist()])
    in_corpus |= torch.isin(inputs["input_ids"], torch.tensor(tokenizer.all_special_ids))
    scores = {}
    for name, mask in (
        ("", inputs["attention_mask"]),
        ("_corpus_wordpieces_only", inputs["attention_mask"] * in_corpus),
    ):
        query = embedder(inputs["input_ids"], attention_mask=mask, token_type_ids=torch.zeros_like(mask))
        _, ids = index.search(query.projected_score, k)
        scores |= question_recall(questions, ids.tolist(), texts, k, name)
        if not name:
            scores |= subject_recall(questions, ids.tolist(), texts, k)
    # The same facts asked as clozes in the corpus's own relative-clause wording (synthetic_world.RELATIVE, what a
    # world with meetings writes in its Notes), the answer masked: the question's wording taken out of the measure.
    clozes = cloze_questions(generated, tokenizer)
    inputs = tokenizer([q["question"] for q in clozes], padding=True, return_tensors="pt")
    query = embedder(
        inputs["input_ids"],
        attention_mask=inputs["attention_mask"],
        token_type_ids=torch.zeros_like(inputs["input_ids"]),
    )
    _, ids = index.search(query.projected_score, k)
    scores |= question_recall(clozes, ids.tolist(), texts, k, "_cloze")
    return scores


def subject_recall(questions: list[dict], ids: list[list[int]], texts: list[str], k: int) -> dict:
    """Topic found (%): a block naming the question's subject among the top k, on the held-out (test) questions. With
    answer recall, it tells a retriever that does not find whom a question is about from one that finds them but not
    the block stating the fact."""
    test = [any(q["entity"] in texts[i] for i in row) for q, row in zip(questions, ids) if q["split"] == "test"]
    return {f"subject_in_top{k}_test": round(100 * sum(test) / max(1, len(test)), 1)}


def cloze_questions(world, tokenizer) -> list[dict]:
    """Each question's fact as a statement in synthetic_world.RELATIVE's wording with its first answer replaced by as
    many [MASK] as it has wordpieces (a masked query of a Notes sentence); same answers and splits."""
    from openrealm.trainers.world.synthetic_world import RELATIVE, template_field

    facts = {fact["fact_id"]: fact for fact in world.facts}
    clozes = []
    for question in world.questions:
        fact = facts[question["fact"]]
        masks = " ".join([tokenizer.mask_token] * len(tokenizer.tokenize(question["answers"][0])))
        fields = {fact["subject_kind"]: fact["subject"], template_field(fact["value_kind"]): masks}
        text = RELATIVE[fact["relation"]][0].format(**fields)
        clozes.append({**question, "question": text})
    return clozes


def question_recall(questions: list[dict], ids: list[list[int]], texts: list[str], k: int, suffix: str = "") -> dict:
    """recall@k (%) of an answer string in the retrieved blocks, on all questions and on the held-out (test) ones."""
    hits = [any(a in texts[i] for i in row for a in q["answers"]) for q, row in zip(questions, ids)]
    test = [hit for hit, q in zip(hits, questions) if q["split"] == "test"]
    return {
        f"recall@{k}{suffix}": round(100 * sum(hits) / len(hits), 1),
        f"recall@{k}_test{suffix}": round(100 * sum(test) / max(1, len(test)), 1),
    }


def bm25_zero_shot_recall(corpus: Path, world: Path, k: int = 5) -> dict[str, float]:
    """The same recall@k for BM25 over the blocks' titles and texts (trainers/bm25.py), the lexical reference."""
    from openrealm.tokenization.corpus_folder import load_corpus
    from openrealm.trainers.bm25 import Bm25BlockSearcher
    from openrealm.trainers.world.synthetic_world import World

    blocks, questions = load_corpus(corpus), World.read(world).questions
    texts = blocks["text"]
    ids = Bm25BlockSearcher(texts, blocks["title"]).search([q["question"] for q in questions], k).tolist()
    return question_recall(questions, ids, texts, k) | subject_recall(questions, ids, texts, k)


def closest_answer_block(candidates: list[int], query: str, texts: list[str], rng) -> int:
    """Of the blocks holding a query's masked span, the one sharing the most words with the query (ties: a random
    one): the block stating the same fact, where a span's name also occurs in blocks that state other things about
    it. A perfect reader would find the span in each; REALM's marginal reaches only those among the K retrieved,
    which share the query's other names."""
    words = set(query.lower().split())
    overlaps = [len(words & set(texts[i].lower().split())) for i in candidates]
    best = max(overlaps)
    return rng.choice([i for i, overlap in zip(candidates, overlaps) if overlap == best])


def perfect_reader_marginal(
    stages, corpus: Path, embedder_folder: str, queries: dict, held_out: list[int], k: int
) -> list[dict]:
    """REALM's retriever objective with a perfect reader and every block a candidate (trainers/pretraining/
    retriever_bound.py), from the same start and at the same steps, batch size and lr as pre-training, queries from
    every block but the held-out ones, scored by recall@k on `queries`. Unlike `answer_positive` (in-batch negatives,
    one positive) every block that names a query's names competes, as REALM's top-K candidates do."""
    from transformers import AutoTokenizer

    from openrealm.tokenization.corpus_folder import load_corpus
    from openrealm.trainers.embedding import exact_index
    from openrealm.trainers.pretraining.evaluation import recall_at_k
    from openrealm.trainers.pretraining.retriever_bound import train_retriever_bound
    from openrealm.trainers.towers import load_embedder

    preset, tokenizer, blocks = stages.preset, AutoTokenizer.from_pretrained(corpus), load_corpus(corpus)
    embedder = load_embedder(embedder_folder, tokenizer, seed=stages.seed)
    history = []

    def evaluate(step: int, embedder) -> None:
        index = exact_index(embedder, blocks, tokenizer)
        history.append({"step": step, f"eval_recall@{k}": recall_at_k(embedder, index, queries, k)})

    train_retriever_bound(
        embedder,
        tokenizer,
        blocks,
        steps=preset.pretrain_steps,
        batch_size=preset.pretrain_batch_size,
        learning_rate=preset.pretrain_embedder_learning_rate,
        seed=stages.seed,
        exclude_block_ids=held_out,
        callback=evaluate,
        callback_every=preset.eval_every,
    )
    embedder.save_pretrained(stages.path("perfect-reader-marginal"))
    return history


def answer_positive(
    stages, corpus: Path, embedder_folder: str, queries: dict, held_out: list[int], k: int
) -> list[dict]:
    """The in-batch bound (a ceiling only where a block naming a query's names states its fact, as on the plain world;
    elsewhere `perfect_reader_marginal` is): the embedder alone, trained for as many steps
    and at the same batch size and lr as pre-training, with an answer block of each masked query (another block
    holding the span, the closest to the query: closest_answer_block) as its positive against the batch's other
    positives (in-batch softmax), on queries from every
    block but the held-out ones, scored by recall@k on `queries`. REALM's gradient reaches an answer block only when
    it is among the K - 1 retrieved candidates and the reader copies from it; this one does not go through REALM's
    path (no index, no candidates, no marginal)."""
    import random

    from transformers import AutoTokenizer

    from openrealm.tokenization.corpus_folder import load_corpus
    from openrealm.tokenization.masking import SalientSpanCollator
    from openrealm.tokenization.retriever_inputs import block_retriever_inputs
    from openrealm.trainers.embedding import exact_index
    from openrealm.trainers.pretraining import CANDIDATE_SEQ_LEN
    from openrealm.trainers.pretraining.evaluation import recall_at_k
    from openrealm.trainers.pretraining.retriever_bound import answerable_queries, embed_query_rows
    from openrealm.trainers.towers import load_embedder

    preset, tokenizer, blocks = stages.preset, AutoTokenizer.from_pretrained(corpus), load_corpus(corpus)
    embedder = load_embedder(embedder_folder, tokenizer, seed=stages.seed)
    training = sorted(set(range(len(blocks))) - set(held_out))
    masker, rng, texts = SalientSpanCollator(tokenizer, seed=stages.seed), random.Random(stages.seed), blocks["text"]
    optimizer = torch.optim.AdamW(embedder.parameters(), lr=preset.pretrain_embedder_learning_rate, weight_decay=0.01)
    history = []
    for step in range(preset.pretrain_steps + 1):
        if step % preset.eval_every == 0 or step == preset.pretrain_steps:
            index = exact_index(embedder, blocks, tokenizer)
            history.append({"step": step, f"eval_recall@{k}": recall_at_k(embedder, index, queries, k)})
        if step == preset.pretrain_steps:
            embedder.save_pretrained(stages.path("answer-positive"))
            return history
        records = [blocks[i] for i in rng.sample(training, preset.pretrain_batch_size)]
        batch, answers, rows = answerable_queries(masker, records, texts)
        if not rows:  # no query of the batch has an answer block elsewhere: nothing to learn from this step
            continue
        queries_text = batch["query_text"]
        positives = [blocks[closest_answer_block(answers[row], queries_text[row], texts, rng)] for row in rows]
        docs = [
            block_retriever_inputs(d["title_ids"], d["token_ids"], tokenizer, CANDIDATE_SEQ_LEN) for d in positives
        ]
        docs = tokenizer.pad(docs, return_tensors="pt")
        scores = embed_query_rows(embedder, batch, rows) @ embedder(**docs).projected_score.T  # [B, B]
        torch.nn.functional.cross_entropy(scores, torch.arange(len(rows))).backward()
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    raise SystemExit(main())
