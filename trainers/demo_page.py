"""The demo page of `openrealm demo` (trainers/jobs/demo.py): a local web page (Gradio) that answers questions with a
RealmForOpenQA model and shows where each answer came from.

    openrealm demo --model realm-quickstart            # the quickstart's output: its REALM model, its test questions
    openrealm demo --model owner/realm-nq [--port 7860] [--host 0.0.0.0] [--share] [--example "who wrote hamlet?"]
    openrealm demo --model owner/realm-nq --corpus my_corpus [--index my_index]   # answers from your documents

The page has a question box and controls for the number of answers (top-k) and of blocks read. Each answer shows its
probability, the title and retrieval score of the block it was read from, and that block's text with the answer
highlighted; the other retrieved blocks follow, best first, each marked as read or only retrieved.

This file imports nothing from openrealm: `openrealm push --with-demo` copies it beside a Hugging Face Space's app.py,
where the model runs as the checkpoint's own custom code (`trust_remote_code`) without openrealm installed.
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path

MAX_ANSWERS = 10  # top-k slider's upper end
MAX_READ = 100  # blocks-read slider's upper end (REALM++ reads 100 at inference)
NUM_RETRIEVED = 10  # blocks listed per question (at least those read)
NUM_EXAMPLES = 5  # example questions taken from a quickstart output's held-out questions
# Inline styles: the page needs no stylesheet, so it looks the same locally, in a Space and in any Gradio version.
MARK_STYLE = "background:#ffe066;color:#000;padding:0 2px;border-radius:3px"
CARD_STYLE = "border:1px solid #8884;border-radius:8px;padding:10px 12px;margin:8px 0"
META_STYLE = "opacity:0.75;font-size:0.9em"


def resolve_model(model: str) -> tuple[str, list[str]]:
    """(the model to load, example questions). A quickstart output folder (OUTPUT/realm-openqa + OUTPUT/world) stands
    for its fine-tuned REALM model, with the first held-out test questions as examples; anything else is returned as
    given (a RealmForOpenQA folder or a Hub repo id) with no examples."""
    root = Path(model)
    if not (root / "realm-openqa" / "config.json").is_file():
        return model, []
    examples = []
    questions = root / "world" / "questions_test.jsonl"
    if questions.is_file():  # read here: this file runs in a Space without openrealm (no tokenization.jsonl)
        with open(questions, encoding="utf-8") as file:
            for number, line in enumerate(file, start=1):
                if not line.strip() or len(examples) == NUM_EXAMPLES:
                    continue
                try:
                    question = json.loads(line)["question"]
                except (json.JSONDecodeError, KeyError, TypeError) as error:
                    problem = f"not a JSON object with a 'question' ({type(error).__name__}: {error})"
                    raise ValueError(f"{questions}, line {number}: {problem}") from None
                if not isinstance(question, str):
                    raise ValueError(f"{questions}, line {number}: 'question' is not a string")
                examples.append(question)
    return str(root / "realm-openqa"), examples


def load_question_answerer(model: str, device: str | None = None, corpus: str | None = None, index: str | None = None):
    """`pipeline("question-answering")` for a RealmForOpenQA folder or Hub id (answering from `corpus`, with `index`,
    when given): openrealm's pipeline when openrealm is installed, else the checkpoint's own custom code (as in a
    Space)."""
    from transformers import pipeline

    try:
        from openrealm.pipeline_realm import question_answerer
    except ImportError:
        corpus_kwargs = {} if corpus is None else {"corpus": corpus, "index": index}
        return pipeline("question-answering", model=model, device=device, trust_remote_code=True, **corpus_kwargs)
    return question_answerer(model, corpus=corpus, index=index, device=device)


def highlight(text: str, start: int | None, end: int | None) -> str:
    """text as HTML with text[start:end] in a <mark> (the whole text escaped; no mark when the span is unknown)."""
    if start is None or end is None or not 0 <= start < end <= len(text):
        return html.escape(text)
    before, answer, after = (html.escape(part) for part in (text[:start], text[start:end], text[end:]))
    return f'{before}<mark style="{MARK_STYLE}">{answer}</mark>{after}'


def title_html(title: str) -> str:
    """A block's title, escaped; blocks of 4.x corpora have none."""
    return html.escape(title) if title else "<i>untitled</i>"


def block_name(item: dict) -> str:
    """ "block 17", or "block 17, passage 18" for a corpus of passages (`corpus build --passages-as-blocks`), or
    "block 17, document notes/a.md" for a corpus built from a folder of documents."""
    for key, name in (("passage_id", "passage"), ("path", "document")):
        if item.get(key) is not None:
            return f"block {item['block_id']}, {name} {html.escape(item[key])}"
    return f"block {item['block_id']}"


def answers_html(answers: list[dict]) -> str:
    """One card per answer: the answer and its probability, then the block it was read from (title, block id,
    retrieval score) with the answer highlighted in the block's text."""
    if not answers:
        return "<p>No answer: the model read no block.</p>"
    cards = []
    for rank, answer in enumerate(answers, 1):
        cards.append(
            f'<div class="realm-answer" style="{CARD_STYLE}">'
            f'<div><b>{rank}.</b> <span class="realm-answer-text" style="font-size:1.2em;font-weight:600">'
            f"{html.escape(answer['answer'])}</span> "
            f'<span style="{META_STYLE}">probability {answer["score"]:.1%}</span></div>'
            f'<div style="{META_STYLE}">from <b class="realm-title">{title_html(answer["title"])}</b> '
            f"({block_name(answer)}, retrieval score {answer['retrieval_score']:.2f})</div>"
            f'<p class="realm-block">{highlight(answer["text"], answer["start"], answer["end"])}</p>'
            "</div>"
        )
    return "".join(cards)


def blocks_html(blocks: list[dict], answers: list[dict]) -> str:
    """The retrieved blocks that no answer came from, best first: rank, title, block id, retrieval score, whether the
    reader read it, and its text."""
    shown = {answer["block_id"] for answer in answers}
    rows = []
    for rank, block in enumerate(blocks, 1):
        if block["block_id"] in shown:
            continue
        status = "read" if block["read"] else "retrieved, not read"
        rows.append(
            f'<div class="realm-retrieved" style="{CARD_STYLE}">'
            f"<div><b>#{rank}</b> <b>{title_html(block['title'])}</b> "
            f'<span style="{META_STYLE}">{block_name(block)}, retrieval score '
            f"{block['retrieval_score']:.2f}, {status}</span></div>"
            f"<p>{html.escape(block['text'])}</p></div>"
        )
    return "".join(rows) or "<p>Every retrieved block holds one of the answers above.</p>"


def ask(qa, question: str, top_k: int, num_blocks: int, num_retrieved: int = NUM_RETRIEVED) -> tuple[str, str]:
    """(answers HTML, other retrieved blocks HTML) for one question; ValueError for an empty question."""
    if not question or not question.strip():
        raise ValueError("Type a question first.")
    result = qa(
        question,
        top_k=int(top_k),
        num_blocks=int(num_blocks),
        num_retrieved=max(int(num_retrieved), int(num_blocks)),
        return_blocks=True,
    )
    return answers_html(result["answers"]), blocks_html(result["blocks"], result["answers"])


def build_demo(qa, *, examples: list[str] | tuple[str, ...] = (), num_retrieved: int = NUM_RETRIEVED, title=None):
    """The Gradio page (a `gr.Blocks`, not launched) for `qa`: a question-answering pipeline, or a model folder or
    Hub id to load one from."""
    import gradio as gr

    name = qa if isinstance(qa, str) else getattr(qa.model, "name_or_path", "") or "REALM"
    if os.path.isdir(name):  # a local folder: its last two path parts, as a Hub id reads
        name = "/".join(Path(name).resolve().parts[-2:])
    if isinstance(qa, str):
        qa = load_question_answerer(qa)
    config = qa.model.config
    max_read = max(1, min(MAX_READ, len(qa.model.retriever.block_records)))
    default_read = min(config.reader_beam_size, max_read)

    def respond(question, top_k, num_blocks):
        try:
            return ask(qa, question, top_k, num_blocks, num_retrieved)
        except ValueError as error:
            raise gr.Error(str(error)) from None

    with gr.Blocks(title=title or f"OpenREALM: {name}", analytics_enabled=False) as demo:
        gr.Markdown(
            f"## {html.escape(title or 'Ask ' + str(name))}\nREALM retrieves blocks of its knowledge corpus, reads "
            "the "
            "best of them and answers with a span of one: each answer below shows the block it came from."
        )
        with gr.Row():
            question = gr.Textbox(label="Question", placeholder="Ask a question", scale=5, elem_id="question")
            button = gr.Button("Ask", variant="primary", scale=1, elem_id="ask")
        with gr.Row():
            top_k = gr.Slider(1, MAX_ANSWERS, value=3, step=1, label="Answers (top-k)", elem_id="top-k")
            num_blocks = gr.Slider(1, max_read, value=default_read, step=1, label="Blocks read", elem_id="blocks-read")
        if examples:
            gr.Examples(examples=[[text] for text in examples], inputs=[question], label="Examples")
        answers = gr.HTML(elem_id="answers")
        gr.Markdown("### Other retrieved blocks")
        retrieved = gr.HTML(elem_id="retrieved")
        for event in (button.click, question.submit):
            event(respond, inputs=[question, top_k, num_blocks], outputs=[answers, retrieved])
    return demo


__all__ = [
    "MARK_STYLE",
    "NUM_EXAMPLES",
    "NUM_RETRIEVED",
    "answers_html",
    "ask",
    "blocks_html",
    "build_demo",
    "highlight",
    "load_question_answerer",
    "resolve_model",
]
