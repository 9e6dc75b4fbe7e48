"""Training: ICT warm start, REALM pre-training, index refresh, open-QA fine-tuning, evaluation and the CLI."""
