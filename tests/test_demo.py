"""`openrealm demo`: the answers with the block each came from, the answer highlighted in it, and the other retrieved
blocks; the Space-ready app of `push --with-demo` runs without openrealm; the page works in a real browser.

The browser test drives Debian's chromium (/usr/bin/chromium) with Playwright. Without chromium or playwright it is
skipped, unless OPENREALM_REQUIRE_BROWSER=1 (set by .ci/run, which installs chromium), when it fails instead.
Set OPENREALM_DEMO_SCREENSHOT=PATH to keep the page's screenshot (the README's picture is made that way).
"""

import ast
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from helpers import BLOCK_TEXTS, free_port, make_openqa_model
from transformers import pipeline

import openrealm  # noqa: F401 - registers the question-answering pipeline
from openrealm.hub_cards.space_app import APP_FILES, space_requirements, write_space_app
from openrealm.trainers import demo_page as demo

QUESTION = "which river flows through london ?"
CHROMIUM = "/usr/bin/chromium"
BROWSER_REQUIRED = os.environ.get("OPENREALM_REQUIRE_BROWSER") == "1"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("demo") / "realm-openqa"
    make_openqa_model(seed=0).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def qa(folder):
    return pipeline("question-answering", model=str(folder))


def test_highlight_marks_exactly_the_answer_and_escapes_the_text():
    page = demo.highlight("a <b> & c", 2, 5)
    assert page.startswith("a <mark ") and page.endswith(">&lt;b&gt;</mark> &amp; c")


@pytest.mark.parametrize("start, end", [(None, None), (3, 3), (0, 99)])
def test_highlight_without_a_valid_span_only_escapes(start, end):
    assert demo.highlight("x < y", start, end) == "x &lt; y"


def test_ask_shows_each_answer_in_its_block_and_the_other_retrieved_blocks(qa):
    answers_page, blocks_page = demo.ask(qa, QUESTION, top_k=2, num_blocks=3, num_retrieved=6)
    result = qa(QUESTION, top_k=2, num_blocks=3, num_retrieved=6, return_blocks=True)
    assert answers_page.count('class="realm-answer"') == 2
    for answer in result["answers"]:
        assert f'<mark style="{demo.MARK_STYLE}">{answer["answer"]}</mark>' in answers_page
        assert f"block {answer['block_id']}, retrieval score {answer['retrieval_score']:.2f}" in answers_page
        assert f"probability {answer['score']:.1%}" in answers_page
    sources = {answer["block_id"] for answer in result["answers"]}
    assert blocks_page.count('class="realm-retrieved"') == 6 - len(sources)
    for block in result["blocks"]:
        assert (BLOCK_TEXTS[block["block_id"]] in blocks_page) == (block["block_id"] not in sources)
    assert blocks_page.count(", read</span>") == 3 - len(sources)
    assert blocks_page.count("retrieved, not read") == 3


def test_answers_and_blocks_of_a_corpus_of_passages_name_their_passage_ids():
    answer = {"answer": "x", "score": 0.5, "title": "t", "text": "x y", "start": 0, "end": 1, "retrieval_score": 1.0}
    answers = [{**answer, "block_id": 3, "passage_id": "dpr-4"}]
    blocks = [{"block_id": 5, "passage_id": "dpr-6", "title": "u", "text": "z", "retrieval_score": 0.5, "read": True}]
    assert "(block 3, passage dpr-4, retrieval score 1.00)" in demo.answers_html(answers)
    assert "block 5, passage dpr-6, retrieval score 0.50, read" in demo.blocks_html(blocks, answers)


def test_a_4x_folder_answers_and_its_untitled_blocks_say_so():
    # the 4.57 port's layout: pytorch_model.bin and block_records.npy of texts without titles
    qa = demo.load_question_answerer(str(Path(__file__).parent / "reference" / "fixtures" / "openqa_hub"))
    answers_page, blocks_page = demo.ask(qa, "where is paris ?", top_k=2, num_blocks=2, num_retrieved=4)
    assert answers_page.count('<b class="realm-title"><i>untitled</i></b>') == 2
    assert blocks_page.count("<b><i>untitled</i></b>") == blocks_page.count('class="realm-retrieved"') > 0
    assert answers_page.count("<mark ") == 2


@pytest.mark.parametrize("question", ["", "  "])
def test_ask_refuses_an_empty_question(qa, question):
    with pytest.raises(ValueError, match="Type a question"):
        demo.ask(qa, question, top_k=1, num_blocks=1)


def test_a_quickstart_output_stands_for_its_realm_model_with_its_test_questions(tmp_path):
    (tmp_path / "realm-openqa").mkdir()
    (tmp_path / "realm-openqa" / "config.json").write_text("{}")
    (tmp_path / "world").mkdir()
    questions = [{"question": f"who founded town {i}?", "answers": ["x"]} for i in range(7)]
    (tmp_path / "world" / "questions_test.jsonl").write_text("".join(json.dumps(q) + "\n" for q in questions))
    model, examples = demo.resolve_model(str(tmp_path))
    assert model == str(tmp_path / "realm-openqa")
    assert examples == [f"who founded town {i}?" for i in range(demo.NUM_EXAMPLES)]


@pytest.mark.parametrize(
    "bad_line, problem",
    [("{not json", "JSONDecodeError"), ('{"text": "who?"}', "KeyError"), ('["who?"]', "TypeError"),
     ('{"question": 3}', "'question' is not a string")],
)  # fmt: skip
def test_a_bad_line_of_the_test_questions_is_named_by_file_and_line(tmp_path, bad_line, problem):
    (tmp_path / "realm-openqa").mkdir()
    (tmp_path / "realm-openqa" / "config.json").write_text("{}")
    (tmp_path / "world").mkdir()
    path = tmp_path / "world" / "questions_test.jsonl"
    path.write_text(json.dumps({"question": "who?"}) + "\n\n" + bad_line + "\n")
    with pytest.raises(ValueError, match=rf"questions_test\.jsonl, line 3: .*{problem}"):
        demo.resolve_model(str(tmp_path))


def test_any_other_model_is_loaded_as_given(folder):
    assert demo.resolve_model(str(folder)) == (str(folder), [])
    assert demo.resolve_model("owner/realm-nq") == ("owner/realm-nq", [])


def test_without_gradio_the_command_says_what_to_install(folder, monkeypatch, capsys):
    from openrealm.trainers.cli import main

    monkeypatch.setitem(sys.modules, "gradio", None)  # `import gradio` raises ImportError
    assert main(["demo", "--model", str(folder)]) == 1
    assert 'pip install "openrealm[demo]"' in capsys.readouterr().err


def test_the_demo_file_imports_nothing_from_openrealm_at_module_level():
    tree = ast.parse(Path(demo.__file__).read_text())
    imported = [alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names]
    imported += [node.module for node in tree.body if isinstance(node, ast.ImportFrom)]
    assert not [name for name in imported if name.startswith("openrealm")]


def test_the_space_app_files_are_written_into_the_folder(folder, tmp_path):
    target = tmp_path / "model"
    shutil.copytree(folder, target)
    written = write_space_app(target, "me/realm-toy")
    assert [path.name for path in written] == list(APP_FILES)
    assert (target / "openrealm_demo.py").read_text() == Path(demo.__file__).read_text()
    assert "build_demo('me/realm-toy')" in (target / "app.py").read_text()
    requirements = (target / "requirements.txt").read_text().split()
    assert any(line.startswith("gradio") for line in requirements)
    assert not any(line.startswith("faiss") for line in requirements)  # an exact index needs no faiss


def test_a_faiss_index_adds_faiss_to_the_space_requirements(tmp_path):
    make_openqa_model(seed=0, index_type="flat").save_pretrained(tmp_path)
    assert "faiss-cpu>=1.8" in space_requirements(tmp_path)


@pytest.mark.slow
def test_the_space_app_answers_without_openrealm_installed(folder, tmp_path):
    """app.py + openrealm_demo.py, in a process where `import openrealm` fails: the checkpoint's custom code answers
    exactly what openrealm's pipeline answers here."""
    space = tmp_path / "model"
    shutil.copytree(folder, space)
    write_space_app(space, str(space))
    script = (
        "import json, sys\n"
        "sys.modules['openrealm'] = None\n"  # `import openrealm` now raises ImportError
        "import app, openrealm_demo\n"
        f"qa = openrealm_demo.load_question_answerer({str(space)!r})\n"
        f"result = qa({QUESTION!r}, top_k=2, num_retrieved=4, return_blocks=True)\n"
        "print(json.dumps([type(app.demo).__name__, type(qa).__module__, result]))\n"
    )
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "GRADIO_ANALYTICS_ENABLED": "False"}
    done = subprocess.run([sys.executable, "-c", script], cwd=space, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    kind, module, result = json.loads(done.stdout.strip().splitlines()[-1])
    assert module.startswith("transformers_modules.")  # the checkpoint's own code, not openrealm's
    assert kind == "Blocks"
    expected = pipeline("question-answering", model=str(folder))(
        QUESTION, top_k=2, num_retrieved=4, return_blocks=True
    )
    assert [a["answer"] for a in result["answers"]] == [a["answer"] for a in expected["answers"]]
    assert [b["block_id"] for b in result["blocks"]] == [b["block_id"] for b in expected["blocks"]]


def wait_for_page(url: str, process: subprocess.Popen, timeout: float = 240) -> None:
    """Until url answers 200, or fail with the server's output if it exits or takes longer than timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"openrealm demo exited with {process.returncode}:\n{process.stdout.read()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"openrealm demo did not serve {url} within {timeout} s")


def chromium_or_skip():
    """Playwright's sync API, or skip (fail when OPENREALM_REQUIRE_BROWSER=1) without it or Debian's chromium."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    missing = [what for what, ok in (("playwright", sync_playwright), (CHROMIUM, Path(CHROMIUM).exists())) if not ok]
    if missing:
        message = f"the browser test needs {' and '.join(missing)} (apt-get install chromium; pip install playwright)"
        if BROWSER_REQUIRED:
            pytest.fail(message)
        pytest.skip(message)
    return sync_playwright


@pytest.mark.slow
def test_the_page_answers_a_typed_question_and_highlights_the_answer_in_its_block(folder, qa, tmp_path):
    sync_playwright = chromium_or_skip()
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "OMP_NUM_THREADS": "1"}
    command = [str(Path(sys.executable).parent / "openrealm"), "demo", "--model", str(folder), "--port", str(port)]
    server = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_page(url, server)
        read = qa.model.config.reader_beam_size  # the page's defaults: 3 answers, the config's blocks read
        expected = qa(QUESTION, top_k=3, num_blocks=read, num_retrieved=demo.NUM_RETRIEVED, return_blocks=True)
        with sync_playwright() as driver:
            browser = driver.chromium.launch(
                executable_path=CHROMIUM,
                args=[
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-quic",
                    "--no-first-run",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                ],
            )
            page = browser.new_page(viewport={"width": 1100, "height": 1000})
            page.goto(url)
            page.locator("#question textarea").fill(QUESTION)
            page.locator("#ask").click()
            page.locator("#answers mark").first.wait_for(timeout=60_000)
            shown = [text.strip() for text in page.locator("#answers .realm-answer-text").all_inner_texts()]
            marked = [text.strip() for text in page.locator("#answers mark").all_inner_texts()]
            titles = page.locator("#answers .realm-title").all_inner_texts()
            retrieved = page.locator("#retrieved .realm-retrieved").count()
            screenshot = os.environ.get("OPENREALM_DEMO_SCREENSHOT") or str(tmp_path / "demo.png")
            page.screenshot(path=screenshot, full_page=True)
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert shown == [answer["answer"] for answer in expected["answers"]]
    assert marked == shown  # each answer highlighted in its own block
    assert titles == [answer["title"] for answer in expected["answers"]]
    sources = {answer["block_id"] for answer in expected["answers"]}
    assert retrieved == len([b for b in expected["blocks"] if b["block_id"] not in sources]) > 0
    assert Path(screenshot).stat().st_size > 10_000
