"""`openrealm demo`: serve the demo page (trainers/demo_page.py) until interrupted.

openrealm demo --model realm-quickstart            # the quickstart's output: its REALM model, its test questions
openrealm demo --model owner/realm-nq [--port 7860] [--host 0.0.0.0] [--share] [--example "who wrote hamlet?"]
openrealm demo --model owner/realm-nq --corpus my_corpus [--index my_index]   # answers from your documents
"""

from __future__ import annotations

import argparse
import os
import sys

from openrealm.trainers.demo_page import build_demo, load_question_answerer, resolve_model


def run(args: argparse.Namespace) -> int:
    """`openrealm demo`: load the model, then serve the page until interrupted."""
    try:
        import gradio  # noqa: F401
    except ImportError:
        print('openrealm: error: the demo needs Gradio: pip install "openrealm[demo]"', file=sys.stderr)
        return 1
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    model, examples = resolve_model(args.model)
    qa = load_question_answerer(model, device=args.device, corpus=args.corpus, index=args.index)
    demo = build_demo(qa, examples=[*examples, *(args.example or [])], num_retrieved=args.num_retrieved)
    demo.queue()
    _, local_url, share_url = demo.launch(
        server_name=args.host, server_port=args.port, share=args.share, quiet=True, prevent_thread_lock=True
    )
    print(f"Demo of {model} at {share_url or local_url} (Ctrl+C to stop)", flush=True)
    try:
        demo.block_thread()
    except KeyboardInterrupt:
        pass
    finally:
        demo.close()
    return 0


__all__ = ["run"]
