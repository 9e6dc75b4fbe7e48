"""The commands of `openrealm`, one module per command (trainers/cli.py lists them in JOBS): each holds `run(args)`
and the wiring of the machinery it runs, and nothing another module imports.

quickstart.py    openrealm quickstart          world.py        openrealm world
corpus_build.py  openrealm corpus build        corpus_edit.py  openrealm corpus add | update | remove
train_ict.py     openrealm train ict           train_mlm.py    openrealm train mlm
train_pretrain.py openrealm train pretrain     train_openqa.py openrealm train openqa
index_build.py   openrealm index build         evaluate.py     openrealm evaluate
ask.py           openrealm ask                 demo.py         openrealm demo
push.py          openrealm push
"""

__all__: list[str] = []
