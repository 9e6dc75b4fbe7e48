"""The stages of REALM (ICT, masked-LM, pre-training with the index refresh, open-QA fine-tuning), evaluation and the
`openrealm` command line: one module per job, wiring the machinery of pretraining/, world/, embedding.py and
stage_utils.py (README.md, "Layout")."""

__all__: list[str] = []
