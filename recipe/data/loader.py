"""Datasets for torchtitan's dataloader: byte-tokenized documents packed into fixed windows, resumable.

`synthetic` (the offline default) generates a seeded long-range recall corpus; `local` reads a folder or a
glob of .txt/.jsonl/.json/.parquet files (`training.dataset_path`); `c4` streams HF `allenai/c4` (`en`), or
a local HF dataset folder given as `training.dataset_path`, and fails at once when the hub is offline or
unreachable. The dataloader logs which source it reads and how much (for local files: files, bytes and,
where no file must be read for it, documents). Each source yields this data-parallel rank's documents;
`PackedDocuments` turns them into [BOS doc EOS BOS doc EOS ...] windows of `seq_len + 1` tokens, and
torchtitan's `ParallelAwareDataloader` (a torchdata StatefulDataLoader) saves source position and the
partial window in every checkpoint, so a resumed run sees exactly the batches an uninterrupted one would.
A `local` document that cannot be read is named by file, line and byte offset, and stops the job or, with
`[data] bad_documents = "skip"`, is left out with a counted warning; `check_training_data` runs the checks
that need no document at start-up.
"""
from __future__ import annotations

import glob
import json
import os
import random
import urllib.error
import urllib.request
from abc import ABC, abstractmethod
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

import torch
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import IterableDataset
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.components.tokenizer import BaseTokenizer
from torchtitan.tools.logging import logger

from recipe.errors import RunStopped

LOCAL_SUFFIXES = (".txt", ".jsonl", ".json", ".parquet")
C4_HUB_PATH = "allenai/c4"
HUB_TIMEOUT_S = 5.0  # how long the hub may take to answer before `c4` gives up


class DocumentSource(Stateful, ABC):
    """This data-parallel rank's documents in a fixed order, endlessly; the state resumes after the last one yielded."""

    @abstractmethod
    def __iter__(self) -> Iterator[str]:
        ...

    @abstractmethod
    def describe(self) -> str:
        """What the source reads, for the start-up log; cheap (never reads the documents themselves)."""


# ---------------------------------------------------------------------------------------------------------
# synthetic: filler text with key/value facts that are recalled half a document later

_WORDS = (
    "amber harbor silent meadow copper lantern river stone winter orchard signal canyon velvet engine "
    "quiet garden marble tower hollow forest bright signal paper comet distant valley salt ember north "
    "cedar window iron bridge crimson field slow thunder glass island mossy ladder violet ocean dusty road "
    "golden spiral frozen lake humble market narrow street pale moon rusty anchor swift falcon"
).split()


def _filler_sentence(rng: random.Random) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(5, 12))]
    return " ".join(words).capitalize() + "."


def _section(rng: random.Random, n_chars: int, inserts: list[str]) -> list[str]:
    """Filler sentences of about `n_chars` characters with `inserts` placed at random sentence slots."""
    sentences: list[str] = []
    budget = n_chars - sum(len(s) + 1 for s in inserts)
    while budget > 0:
        sentences.append(_filler_sentence(rng))
        budget -= len(sentences[-1]) + 1
    for text in inserts:
        sentences.insert(rng.randint(0, len(sentences)), text)
    return sentences


def synthetic_document(seed: int, doc_id: int, n_chars: int) -> str:
    """A deterministic document of about `n_chars` ASCII characters.

    Its first half states facts "The code of <key> is <value>."; its second half recalls every one of
    them in another order, so predicting a recalled value needs context from up to `n_chars` bytes back.
    """
    rng = random.Random(f"lighthouse-synthetic:{seed}:{doc_id}")
    n_facts = max(1, n_chars // 2048)
    keys = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=6)) for _ in range(n_facts)]
    values = [f"{rng.randrange(10**6):06d}" for _ in range(n_facts)]
    facts = [f"The code of {key} is {value}." for key, value in zip(keys, values)]
    recalls = [f"Recall: the code of {key} is {value}." for key, value in zip(keys, values)]
    rng.shuffle(recalls)
    half = n_chars // 2
    return " ".join(_section(rng, half, facts) + _section(rng, n_chars - half, recalls))


class SyntheticRecall(DocumentSource):
    """Document ids rank, rank + world, rank + 2 * world, ... of the synthetic corpus."""

    def __init__(self, seed: int, doc_chars: int, rank: int, world: int) -> None:
        self.seed, self.doc_chars, self.rank, self.world = seed, doc_chars, rank, world
        self._yielded = 0

    def __iter__(self) -> Iterator[str]:
        while True:
            doc_id = self.rank + self.world * self._yielded
            self._yielded += 1
            yield synthetic_document(self.seed, doc_id, self.doc_chars)

    def describe(self) -> str:
        return f"generated recall documents of about {self.doc_chars:,} characters (seed {self.seed})"

    def state_dict(self) -> dict[str, Any]:
        return {"yielded": self._yielded}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._yielded = state_dict["yielded"]


# ---------------------------------------------------------------------------------------------------------
# local: a folder or a glob of text files


class BadDocument(NamedTuple):
    """A document of a local file that cannot be read: where it is (file, line, byte offset) and why."""

    where: str
    reason: str


class DataError(RunStopped):
    """Training data that cannot be read mid-run (`[data] bad_documents = "stop"`), or none at all."""


def parquet_rows(path: str) -> int:
    """The rows of a Parquet file, from its footer; DataError naming the file if it is not Parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path).metadata.num_rows
    except pa.ArrowException as err:
        raise DataError(f"{path} is not a readable Parquet file ({type(err).__name__}: {err}); replace or remove "
                        "it from training.dataset_path") from err


def _record_text(record: Any, where: str) -> str | BadDocument:
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
        return BadDocument(where, f"expected an object with a string field 'text', got {str(record)[:80]!r}")
    return record["text"]


def _jsonl_document(line: bytes, where: str, start: int) -> str | BadDocument:
    """The text of one JSON line that starts at byte `start` of its file."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as err:
        return BadDocument(f"{where} (byte {start + err.start})", f"bytes that are not UTF-8 ({err.reason})")
    try:
        record = json.loads(text)
    except json.JSONDecodeError as err:
        offset = start + len(text[: err.pos].encode("utf-8"))
        return BadDocument(f"{where} (byte {offset})", f"not a JSON line ({err.msg})")
    return _record_text(record, f"{where} (byte {start})")


def read_documents(path: str) -> Iterator[str | BadDocument]:
    """The documents of one file: a whole .txt file, or the 'text' field of each .jsonl/.json/.parquet record;
    a document that cannot be read is a BadDocument in its place, so the documents after it keep their index."""
    suffix = Path(path).suffix
    if suffix == ".txt":
        data = Path(path).read_bytes()
        try:  # with the newlines a text-mode read gives (\r\n and \r as \n)
            yield data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
        except UnicodeDecodeError as err:
            yield BadDocument(f"{path} (byte {err.start})", f"bytes that are not UTF-8 ({err.reason})")
    elif suffix == ".jsonl":
        with open(path, "rb") as f:
            start = 0
            for line_no, line in enumerate(f, 1):
                if line.strip():
                    yield _jsonl_document(line, f"{path}:{line_no}", start)
                start += len(line)
    elif suffix == ".json":
        data = Path(path).read_bytes()
        try:
            records = json.loads(data.decode("utf-8"))
        except UnicodeDecodeError as err:
            yield BadDocument(f"{path} (byte {err.start})", f"bytes that are not UTF-8 ({err.reason})")
            return
        except json.JSONDecodeError as err:
            yield BadDocument(f"{path} (byte {len(err.doc[: err.pos].encode('utf-8'))})", f"not JSON ({err.msg})")
            return
        for i, record in enumerate(records if isinstance(records, list) else [records]):
            yield _record_text(record, f"{path}[{i}]")
    elif suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except pa.ArrowException as err:
            yield BadDocument(path, f"not a readable Parquet file ({type(err).__name__}: {err})")
            return
        if "text" not in table.column_names:
            raise DataError(no_text_column(path, table.column_names))
        yield from table.column("text").to_pylist()
    else:
        raise ValueError(f"{path}: unsupported file type {suffix!r}; expected one of {LOCAL_SUFFIXES}")


def no_text_column(path: str, columns: list[str]) -> str:
    """The line for a Parquet file without the `text` column the recipe reads its documents from."""
    return f"{path}: parquet file has no 'text' column (columns: {columns}); name the documents' column 'text'"


def check_parquet_columns(files: list[str], key: str) -> None:
    """Each Parquet file of `files` has a `text` column (read from its footer alone); a file that is not Parquet
    is left to the read, which names it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for path in (f for f in files if Path(f).suffix == ".parquet"):
        try:
            columns = pq.read_schema(path).names
        except pa.ArrowException:
            continue
        if "text" not in columns:
            raise ValueError(f"{key}: {no_text_column(path, columns)}")


def match_local_files(pattern: str | None, key: str = "training.dataset_path") -> list[str]:
    """Sorted files of `pattern` (the setting `key`): a folder (every file with a supported suffix below it,
    hidden ones skipped as `**` does), or a glob (recursive `**` allowed) whose every match must have a
    supported suffix. A corpus whose files are all empty is refused too: it would train on BOS/EOS alone.
    Mistakes raise ValueError naming `key`."""
    if not pattern:
        raise ValueError(f"dataset 'local' needs {key}, a folder or a glob such as 'data/**/*.jsonl'")
    if Path(pattern).is_dir():
        below = glob.glob(os.path.join(glob.escape(pattern), "**", "*"), recursive=True)
        files = sorted(f for f in below if Path(f).suffix in LOCAL_SUFFIXES and Path(f).is_file())
        if not files:
            raise ValueError(f"{key}={pattern!r} is a folder with no {'/'.join(LOCAL_SUFFIXES)} files below it")
    else:
        files = sorted(f for f in glob.glob(pattern, recursive=True) if Path(f).is_file())
        if not files:
            dangling = " (a link to nothing)" if os.path.islink(pattern) else ""
            raise ValueError(f"{key}={pattern!r}{dangling} matches no files")
        unsupported = [f for f in files if Path(f).suffix not in LOCAL_SUFFIXES]
        if unsupported:
            raise ValueError(f"{key}={pattern!r} matches unsupported files {unsupported[:4]}; "
                             f"expected suffixes {LOCAL_SUFFIXES}")
    if not any(os.path.getsize(f) for f in files):
        raise ValueError(f"{key}={pattern!r}: its {len(files)} file(s) are all empty")
    check_parquet_columns(files, key)
    return files


class LocalFiles(DocumentSource):
    """Documents of the files in sorted order; rank r takes global documents r, r + world, ...; loops forever.

    A document that cannot be read (`BadDocument`) raises DataError naming file and byte offset, or with
    `skip_bad` is left out with a warning that counts the documents skipped so far."""

    def __init__(self, files: list[str], rank: int, world: int, skip_bad: bool = False) -> None:
        self.files, self.rank, self.world, self.skip_bad = files, rank, world, skip_bad
        self._next = 0  # global index (within the epoch) of the first document not yet consumed
        self.skipped = 0

    def describe(self) -> str:
        """Files and bytes; documents too when counting them reads no file (.txt files and parquet footers)."""
        files = f"{len(self.files):,} file{'s' if len(self.files) != 1 else ''}"
        summary = f"{files}, {sum(os.path.getsize(f) for f in self.files):,} bytes"
        if any(Path(f).suffix in (".jsonl", ".json") for f in self.files):
            return f"{summary} (documents not counted: that would read every .jsonl/.json file)"
        documents = sum(1 if f.endswith(".txt") else parquet_rows(f) for f in self.files)
        return f"{summary}, {documents:,} documents"

    def __iter__(self) -> Iterator[str]:
        while True:
            whole_epoch, found = self._next == 0, False
            for index, doc in enumerate(doc for path in self.files for doc in read_documents(path)):
                if index < self._next or index % self.world != self.rank:
                    continue
                self._next = index + 1
                if isinstance(doc, BadDocument):
                    if not self.skip_bad:
                        raise DataError(f"{doc.where}: {doc.reason}; fix or remove it, or set [data] "
                                        "bad_documents = \"skip\" to leave such documents out")
                    self.skipped += 1
                    logger.warning(f"{doc.where}: {doc.reason}; skipped ({self.skipped} document(s) so far)")
                    continue
                found = found or bool(doc)
                yield doc
            if whole_epoch and not found:
                raise DataError(f"{len(self.files)} files hold no readable document with text for data-parallel "
                                f"rank {self.rank} of {self.world} (the windows would hold BOS and EOS alone); point "
                                "training.dataset_path at documents with text")
            self._next = 0

    def state_dict(self) -> dict[str, Any]:
        return {"next": self._next}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._next = state_dict["next"]


# ---------------------------------------------------------------------------------------------------------
# c4: Hugging Face streaming


_TRUE = ("1", "on", "yes", "true")


def check_hub_reachable(name: str, timeout: float = HUB_TIMEOUT_S) -> None:
    """Raise ValueError at once, suggesting the `local` dataset, when the Hugging Face hub is switched off
    (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE) or does not answer within `timeout` seconds; without this check the
    datasets library retries for about half a minute and ends in a ConnectionError."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    offline = [f"{key}={os.environ[key]}" for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
               if os.environ.get(key, "").lower() in _TRUE]
    if offline:
        reason = f"is switched off ({', '.join(offline)})"
    else:
        try:  # any HTTP answer, even an error status, means the hub is reachable; proxies are honoured
            urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout).close()
            return
        except urllib.error.HTTPError:
            return
        except (OSError, ValueError) as err:  # URLError and timeouts are OSErrors
            reason = f"is not reachable at {endpoint} ({err})"
    raise ValueError(
        f"training.dataset='c4' streams {name} from the Hugging Face hub, which {reason}. Without network, set "
        f"training.dataset = \"local\" and training.dataset_path = a folder or glob of {'/'.join(LOCAL_SUFFIXES)} "
        "files (or training.dataset_path = a local folder of C4 in HF format)"
    )


class HuggingFaceStream(DocumentSource):
    """The 'text' field of a streaming HF dataset, split across ranks; resumes through HF's own state."""

    def __init__(self, dataset, rank: int, world: int, name: str) -> None:
        from datasets.distributed import split_dataset_by_node

        self._data, self.name = split_dataset_by_node(dataset, rank, world), name

    def describe(self) -> str:
        return f"{self.name}, train split, streamed (files, documents and bytes are not counted ahead)"

    def __iter__(self) -> Iterator[str]:
        while True:
            empty = True
            for sample in self._data:
                empty = False
                yield sample["text"]
            if empty:
                raise ValueError("the streaming dataset has no document for this data-parallel rank")
            self._data.set_epoch(self._data.epoch + 1)

    def state_dict(self) -> dict[str, Any]:
        return {"data": self._data.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._data.load_state_dict(state_dict["data"])


def c4_stream(path: str | None, rank: int, world: int) -> HuggingFaceStream:
    """This rank's part of the streaming train split of C4 English from the hub, or of a local HF dataset folder."""
    from datasets import load_dataset

    if path and Path(path).is_dir():
        return HuggingFaceStream(load_dataset(path, split="train", streaming=True), rank, world, path)
    hub_path = path or C4_HUB_PATH
    check_hub_reachable(hub_path)
    return HuggingFaceStream(load_dataset(hub_path, name="en", split="train", streaming=True), rank, world, hub_path)


# ---------------------------------------------------------------------------------------------------------
# packing and the torchtitan hook


class PackedDocuments(IterableDataset, Stateful):
    """({"input": tokens[:-1]}, labels = tokens[1:]) from consecutive `seq_len + 1`-token windows of the stream."""

    def __init__(self, source: DocumentSource, tokenizer: BaseTokenizer, seq_len: int) -> None:
        self.source, self.tokenizer, self.seq_len = source, tokenizer, seq_len
        self._buffer: list[int] = []

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        window = self.seq_len + 1
        for text in self.source:
            self._buffer.extend(self.tokenizer.encode(text, add_bos=True, add_eos=True))
            while len(self._buffer) >= window:
                tokens = torch.tensor(self._buffer[:window], dtype=torch.long)
                self._buffer = self._buffer[window:]
                yield {"input": tokens[:-1]}, tokens[1:]

    def state_dict(self) -> dict[str, Any]:
        return {"buffer": list(self._buffer), "source": self.source.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._buffer = list(state_dict["buffer"])
        try:
            self.source.load_state_dict(state_dict["source"])
        except KeyError as err:
            raise DataError(f"the checkpoint's data position has no {err} for this dataset ({self.source.describe()}): "
                            "it was written with another training.dataset; resume with that one, or pass another "
                            "--job.dump_folder") from err


SourceBuilder = Callable[..., DocumentSource]

# Each builder takes (path, seed, seq_len, rank, world, key=<the path's setting>, skip_bad=<[data] bad_documents>).
DATASETS: dict[str, SourceBuilder] = {
    "synthetic": lambda path, seed, seq_len, rank, world, **_: SyntheticRecall(seed, seq_len, rank, world),
    "local": lambda path, seed, seq_len, rank, world, key, skip_bad: LocalFiles(
        match_local_files(path, key), rank, world, skip_bad),
    "c4": lambda path, seed, seq_len, rank, world, **_: c4_stream(path, rank, world),
}
# Sources that split documents by data-parallel rank only, so dataloader workers would repeat them.
_RANK_SHARDED_ONLY = ("synthetic", "local")


def build_source(name: str, path: str | None, seed: int, seq_len: int, rank: int, world: int,
                 section: str = "training", skip_bad: bool = False) -> DocumentSource:
    """The document source registered as `name`, read for the `[section]` that names it (`training` or
    `validation`, for messages); synthetic documents are `seq_len` characters long."""
    if name not in DATASETS:
        raise ValueError(f"{section}.dataset={name!r} is not one of {sorted(DATASETS)}")
    return DATASETS[name](path, seed, seq_len, rank, world, key=f"{section}.dataset_path", skip_bad=skip_bad)


def _check_workers(training) -> None:
    workers = training.dataloader.num_workers
    if workers < 0:
        raise ValueError(f"training.dataloader.num_workers={workers} must be >= 0 (0 reads in the training process)")
    if workers > 0 and training.dataset in _RANK_SHARDED_ONLY:
        raise ValueError(
            f"training.dataloader.num_workers={workers} with training.dataset={training.dataset!r}: this source "
            "shards by data-parallel rank only and byte tokenization is cheap; use num_workers = 0"
        )


def check_path_is_read(section: str, dataset: str, path: str | None) -> None:
    """`<section>.dataset_path` is unset for the synthetic corpus, which generates its documents: a path there
    would be ignored without a word (a corpus meant to be trained on, or a typo in `dataset`)."""
    if dataset == "synthetic" and path:
        raise ValueError(f"{section}.dataset_path={path!r} with {section}.dataset='synthetic', which generates its "
                         f"documents and reads no file: set {section}.dataset = \"local\" to read it, or unset "
                         f"{section}.dataset_path")


def warn_small_corpus(files: list[str], tokens: int, key: str, what: str) -> None:
    """One warning for `local` files (`key`) that hold fewer bytes than the `tokens` read from them (a token is at
    least a byte): `what` the tokens are, and what repeats the same text."""
    size = sum(os.path.getsize(f) for f in files)
    if size < tokens:
        logger.warning(f"{key}: its {len(files)} file(s) hold {size:,} bytes in all, fewer than the {tokens:,} tokens "
                       f"of {what}")


def check_training_data(job_config) -> None:
    """Start-up checks of `training.dataset`: a known name, a worker count its source can use, `local` files
    that exist and hold bytes (Parquet files with a `text` column; one warning for fewer bytes than a window),
    no path for the synthetic corpus, a hub that answers for `c4` from the hub. The documents themselves are
    read while training (`[data] bad_documents` says what an unreadable one does)."""
    training = job_config.training
    if training.dataset not in DATASETS:
        raise ValueError(f"training.dataset={training.dataset!r} is not one of {sorted(DATASETS)}")
    _check_workers(training)
    check_path_is_read("training", training.dataset, training.dataset_path)
    if training.dataset == "local":
        warn_small_corpus(match_local_files(training.dataset_path), training.seq_len, "training.dataset_path",
                          "one window (training.seq_len): every window repeats the same text")
    elif training.dataset == "c4" and not (training.dataset_path and Path(training.dataset_path).is_dir()):
        check_hub_reachable(training.dataset_path or C4_HUB_PATH)


def build_lighthouse_dataloader(
    dp_world_size: int, dp_rank: int, tokenizer: BaseTokenizer, job_config
) -> ParallelAwareDataloader:
    """TrainSpec hook: the packed, resumable dataloader of `training.dataset` for this data-parallel rank.

    The synthetic corpus is seeded by `debug.seed` (0 when unset).
    """
    training = job_config.training
    _check_workers(training)
    source = build_source(
        training.dataset, training.dataset_path, job_config.debug.seed or 0, training.seq_len, dp_rank, dp_world_size,
        skip_bad=job_config.data.bad_documents == "skip",
    )
    where = f" at training.dataset_path={training.dataset_path!r}" if training.dataset == "local" else ""
    logger.info(f"Dataset {training.dataset!r}{where}: {source.describe()}")
    return ParallelAwareDataloader(
        PackedDocuments(source, tokenizer, training.seq_len),
        dp_rank=dp_rank,
        dp_world_size=dp_world_size,
        batch_size=training.local_batch_size,
        **asdict(training.dataloader),
    )
