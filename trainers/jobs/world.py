"""The `openrealm world` job: generate the synthetic world (trainers/world/synthetic_world.py) into a folder, and
optionally a WordPiece vocabulary trained on its text."""

from __future__ import annotations

import argparse

from openrealm.file_utils import check_apart, check_replaceable
from openrealm.tokenization.vocab import vocab_folder_problem
from openrealm.trainers.world.synthetic_world import generate_world, world_folder_problem


def run(args: argparse.Namespace) -> int:
    # before anything is written: the vocabulary must not replace or land in the world, and --overwrite replaces only
    # folders this command wrote (a world, a vocabulary), never a corpus, a model or notes
    check_replaceable(args.output, args.overwrite, world_folder_problem)
    if args.tokenizer_output:
        check_apart(args.tokenizer_output, [("--output", args.output)], "--tokenizer-output", existing_only=False)
        check_replaceable(args.tokenizer_output, args.overwrite, vocab_folder_problem)
    world = generate_world(
        seed=args.seed,
        num_people=args.num_people,
        num_organizations=args.num_organizations,
        num_cities=args.num_cities,
        num_rivers=args.num_rivers,
        num_mountains=args.num_mountains,
        num_regions=args.num_regions,
        questions_per_fact=args.questions_per_fact,
        mentions_per_person=args.mentions_per_person,
    )
    vocab = None
    if args.tokenizer_output:  # trained before anything is written: a --vocab-size too small is refused first
        from openrealm.tokenization.vocab import wordpiece_vocab

        vocab = wordpiece_vocab(world.texts(), args.vocab_size)
    path = world.write(args.output, overwrite=args.overwrite)
    config = world.config
    print(
        f"{path}: {config['num_entities']} entities, {config['num_facts']} facts, {config['num_articles']} articles, "
        f"{config['num_sentences']} sentences, questions {config['num_questions']}"
    )
    if args.tokenizer_output:
        from openrealm.tokenization.vocab import save_wordpiece_vocab

        tokenizer = save_wordpiece_vocab(vocab, args.tokenizer_output, overwrite=args.overwrite)
        print(f"{args.tokenizer_output}: WordPiece vocabulary of {len(tokenizer)} tokens")
    return 0


__all__ = ["run"]
