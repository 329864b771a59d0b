"""The local tasks' data, read from beside this file: `lm_eval --include_path <this folder>` then works from any
working directory (a `dataset_kwargs: data_files:` path is read relative to the working directory)."""
from __future__ import annotations

from pathlib import Path

import datasets

HERE = Path(__file__).resolve().parent


def _test_split(name: str) -> datasets.DatasetDict:
    return datasets.load_dataset("json", data_files={"test": str(HERE / name)})


def docs(**_) -> datasets.DatasetDict:
    """lighthouse_docs: one document per line of docs.jsonl (`text`)."""
    return _test_split("docs.jsonl")


def choice(**_) -> datasets.DatasetDict:
    """lighthouse_choice: one question per line of choice.jsonl (`context`, `choices`, `label`)."""
    return _test_split("choice.jsonl")
