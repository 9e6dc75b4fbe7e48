"""A Space-ready Gradio app for a REALM open-QA checkpoint (`openrealm push --with-demo`).

Three files go into the model folder, and from there to the Hub with it:

    app.py             builds the page of `openrealm demo` for the repo id and launches it
    openrealm_demo.py  that page: a verbatim copy of trainers/demo_page.py, which imports nothing from openrealm
    requirements.txt   torch, transformers, gradio, safetensors, numpy (and faiss-cpu for a faiss index)

In a Gradio Space holding these files the model runs as the checkpoint's own custom code (`trust_remote_code`), so the
Space needs no openrealm package; `python app.py` beside them does the same on any machine.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path

from openrealm.file_utils import write_text_atomic
from openrealm.index_realm import INDEX_CONFIG_NAME
from openrealm.retrieval_realm import BLOCK_INDEX_DIR

APP_FILES = ("app.py", "openrealm_demo.py", "requirements.txt")
REQUIREMENTS = ["torch>=2.2", "transformers>=5.0,<6", "gradio>=5", "safetensors>=0.4.3", "numpy>=1.24"]

APP_TEMPLATE = '''"""Ask {model_id} questions and see the block each answer came from
(a Gradio app, ready for a Hugging Face Space).

Run it with `pip install -r requirements.txt && python app.py`, or create a Gradio Space and upload app.py,
openrealm_demo.py and requirements.txt. Written by `openrealm push --with-demo`.
"""

from openrealm_demo import build_demo

demo = build_demo({model_id!r})
demo.queue()

if __name__ == "__main__":
    demo.launch()
'''


def space_requirements(folder: str | os.PathLike) -> list[str]:
    """The Space's pip requirements; faiss-cpu only when the folder's index is a faiss index."""
    metadata = Path(folder) / BLOCK_INDEX_DIR / INDEX_CONFIG_NAME
    index_type = json.loads(metadata.read_text()).get("index_type", "exact") if metadata.is_file() else "exact"
    return [*REQUIREMENTS, *(["faiss-cpu>=1.8"] if index_type != "exact" else [])]


# What marks app.py and requirements.txt as written by push (APP_TEMPLATE says it; requirements.txt's first line)
APP_MARK = "Written by `openrealm push --with-demo`."
REQUIREMENTS_MARK = "# written by openrealm push --with-demo"


def check_space_app_replaceable(folder: str | os.PathLike) -> None:
    """A FileExistsError, before anything is written, when FOLDER holds an app.py or requirements.txt that an
    earlier `push --with-demo` did not write (a Space app or requirements of the user's own): write_space_app would
    replace it. A requirements.txt of the requirements alone (as pushes wrote it before REQUIREMENTS_MARK) is
    push's."""
    folder = Path(folder)
    ours = {
        "app.py": lambda text: APP_MARK in text,
        "requirements.txt": lambda text: (
            text.startswith(REQUIREMENTS_MARK) or set(text.split()) <= {*REQUIREMENTS, "faiss-cpu>=1.8"}
        ),
    }
    for name, written_by_push in ours.items():
        path = folder / name
        if path.exists() and not written_by_push(path.read_text(encoding="utf-8", errors="replace")):
            raise FileExistsError(
                f"{path} was not written by openrealm push --with-demo, which would replace it with the demo's: move "
                "it out of the folder, or push without --with-demo"
            )


def write_space_app(folder: str | os.PathLike, model_id: str) -> list[Path]:
    """Write app.py, openrealm_demo.py and requirements.txt into `folder` (each atomically) for the checkpoint
    `model_id` (a Hub repo id, or a path the app can load). Returns the paths written."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"No model folder {folder}")
    contents = {
        "app.py": APP_TEMPLATE.format(model_id=model_id),
        "openrealm_demo.py": resources.files("openrealm.trainers")
        .joinpath("demo_page.py")
        .read_text(encoding="utf-8"),
        "requirements.txt": "\n".join([REQUIREMENTS_MARK, *space_requirements(folder)]) + "\n",
    }
    return [Path(write_text_atomic(folder / name, text)) for name, text in contents.items()]


__all__ = ["APP_FILES", "check_space_app_replaceable", "space_requirements", "write_space_app"]
