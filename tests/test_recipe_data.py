"""Byte tokenizer, the three datasets (a local folder or glob, c4 failing fast offline), the start-up log,
packing, data-parallel sharding and exact resumption."""
import itertools
import json
import logging
import os
import random
import re
import string
import urllib.error
import urllib.request
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from torchtitan.config.job_config import DataLoader
from recipe.data import loader as data
from recipe.data.loader import (
    DATASETS,
    HUB_TIMEOUT_S,
    LocalFiles,
    PackedDocuments,
    build_lighthouse_dataloader,
    build_source,
    match_local_files,
    read_documents,
    synthetic_document,
)
from recipe.data.tokenizer import BOS_ID, EOS_ID, VOCAB_SIZE, ByteTokenizer


def random_text(rng: random.Random, n: int) -> str:
    alphabet = string.ascii_letters + string.digits + " .,;\n" + "äöüßéλ中文🙂"
    return "".join(rng.choice(alphabet) for _ in range(n))


def loader(dataset="synthetic", path=None, rank=0, world=1, seq_len=64, batch=2, workers=0):
    """The TrainSpec dataloader for a job that sets only what the data pipeline reads."""
    training = SimpleNamespace(dataset=dataset, dataset_path=path, seq_len=seq_len, local_batch_size=batch,
                               dataloader=DataLoader(num_workers=workers))
    job = SimpleNamespace(training=training, debug=SimpleNamespace(seed=None),
                          data=SimpleNamespace(bad_documents="stop"))
    return build_lighthouse_dataloader(world, rank, ByteTokenizer(), job)


def test_byte_tokenizer_round_trips_utf8_and_wraps_documents_in_bos_eos():
    text = random_text(random.Random(), 200)
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert ids[0] == BOS_ID and ids[-1] == EOS_ID and ids[1:-1] == list(text.encode("utf-8"))
    assert tok.decode(ids) == text and tok.get_vocab_size() == VOCAB_SIZE == 258
    assert tok.encode(text, add_bos=False, add_eos=False) == ids[1:-1]
    with pytest.raises(ValueError, match=r"\[258, -1\]"):
        tok.decode([65, 258, -1])


@pytest.mark.parametrize("seed, doc", [(0, 0), (3, 4), (7, 28), (14, 60), (517, 98_765)])
def test_synthetic_documents_are_seeded_and_recall_every_fact_later(seed, doc):
    text = synthetic_document(seed, doc, 8192)
    assert text == synthetic_document(seed, doc, 8192)
    assert text != synthetic_document(seed, doc + 1, 8192) and text != synthetic_document(seed + 1, doc, 8192)
    assert abs(len(text) - 8192) < 200 and text.isascii()
    facts = dict(p.split(" is ") for p in text.split("The code of ")[1:] for p in [p.split(".")[0]])
    assert len(facts) == 4
    stated = [text.index(f"The code of {key} is") for key in facts]
    recalled = [text.index(f"Recall: the code of {key} is {value}.") for key, value in facts.items()]
    # every fact is stated before any is recalled; each section is about half the text (its last filler
    # sentence may overrun its half by up to the length tolerance)
    assert max(stated) < min(recalled)
    assert max(stated) < len(text) // 2 + 200 and min(recalled) > len(text) // 2 - 200


def test_windows_are_consecutive_slices_of_the_document_token_stream():
    seq_len = 48
    docs = [random_text(random.Random(i), random.randint(5, 120)) for i in range(30)]
    dataset = PackedDocuments(ListSource(docs), ByteTokenizer(), seq_len)
    stream = [t for d in docs for t in ByteTokenizer().encode(d)]
    windows = list(dataset)
    assert len(windows) == len(stream) // (seq_len + 1)
    for i, (inputs, labels) in enumerate(windows):
        chunk = stream[i * (seq_len + 1):(i + 1) * (seq_len + 1)]
        assert inputs["input"].tolist() == chunk[:-1] and labels.tolist() == chunk[1:]


class ListSource:
    """A finite document source, for packing tests."""

    def __init__(self, docs):
        self.docs, self.next = docs, 0

    def __iter__(self):
        while self.next < len(self.docs):
            self.next += 1
            yield self.docs[self.next - 1]

    def state_dict(self):
        return {"next": self.next}

    def load_state_dict(self, state):
        self.next = state["next"]


@pytest.fixture
def local_corpus(tmp_path):
    """A folder of documents in all four local formats (and a nested folder), with their expected texts in glob
    order."""
    rng = random.Random()
    root = tmp_path / "local"
    root.mkdir()
    docs = {}
    (root / "a.txt").write_text(text := random_text(rng, 300), encoding="utf-8")
    docs["a.txt"] = [text]
    lines = [random_text(rng, rng.randint(20, 200)) for _ in range(7)]
    (root / "b.jsonl").write_text("\n".join(json.dumps({"text": t, "id": i}) for i, t in enumerate(lines)))
    docs["b.jsonl"] = lines
    records = [random_text(rng, 80) for _ in range(3)]
    (root / "c.json").write_text(json.dumps([{"text": t} for t in records]))
    docs["c.json"] = records
    (root / "sub").mkdir()
    rows = [random_text(rng, 150) for _ in range(5)]
    pq.write_table(pa.table({"text": rows}), root / "sub" / "d.parquet")
    docs["sub/d.parquet"] = rows
    return root, [t for name in ["a.txt", "b.jsonl", "c.json", "sub/d.parquet"] for t in docs[name]]


def test_local_files_yield_every_document_once_per_epoch_split_across_ranks(local_corpus):
    folder, expected = local_corpus
    files = match_local_files(str(folder / "**" / "*.*"))
    assert [read for f in files for read in read_documents(f)] == expected
    ranks = [list(itertools.islice(LocalFiles(files, r, 3), len(expected))) for r in range(3)]
    for r in range(3):  # rank r takes documents r, r + 3, ... of every epoch
        epoch = expected[r::3]
        assert ranks[r] == (epoch * len(expected))[: len(expected)]


BAD_DOCUMENTS = [  # (file name, bytes: good, bad, good document where the format has several, the bad one's place)
    ("b.jsonl", b'{"text": "first"}\n{"text": "caf\xe9"}\n{"text": "last"}\n',
     r"b\.jsonl:2 \(byte 31\): bytes that are not UTF-8"),
    ("b.jsonl", b'{"text": "first"}\n\n{"text": "open\n{"text": "last"}\n', r"b\.jsonl:3 \(byte 33\): not a JSON line"),
    ("b.jsonl", b'{"text": "first"}\n{"title": "x"}\n{"text": "last"}\n',
     r"b\.jsonl:2 \(byte 18\): expected an object with a string field 'text'"),
    ("b.json", b'[{"text": "first"}, {"text": 3}, {"text": "last"}]', r"b\.json\[1\]: expected an object"),
    ("b.txt", b"caf\xe9 latin-1", r"b\.txt \(byte 3\): bytes that are not UTF-8"),
    ("b.json", b'[{"text": "first"}, ', r"b\.json \(byte 20\): not JSON"),
]


@pytest.mark.parametrize("name, content, message", BAD_DOCUMENTS,
                         ids=["jsonl-latin1", "jsonl-malformed", "jsonl-no-text", "json-no-text", "txt-latin1",
                              "json-truncated"])
def test_an_unreadable_document_stops_naming_file_and_byte_or_is_skipped_and_counted(tmp_path, caplog, name,
                                                                                      content, message):
    (tmp_path / name).write_bytes(content)
    (tmp_path / "z.txt").write_text(after := random_text(random.Random(), 40))  # the next file still follows
    files = match_local_files(str(tmp_path))
    with pytest.raises(data.DataError, match=message + r".*bad_documents = \"skip\"") as err:
        list(itertools.islice(LocalFiles(files, 0, 1), 4))
    assert "\n" not in str(err.value)
    good = [doc for doc in read_documents(str(tmp_path / name)) if isinstance(doc, str)]
    skipping = LocalFiles(files, 0, 1, skip_bad=True)
    with caplog.at_level(logging.WARNING):
        assert list(itertools.islice(skipping, len(good) + 1)) == [*good, after]
    assert skipping.skipped == 1
    assert [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()][0].endswith(
        "skipped (1 document(s) so far)")


def test_a_local_folder_means_every_supported_file_below_it(local_corpus):
    folder, expected = local_corpus
    (folder / "notes.md").write_text("not a document")
    (folder / "sub" / "deeper").mkdir()
    (folder / "sub" / "deeper" / "e.txt").write_text(last := "the last document")
    (folder / ".cache").mkdir()
    (folder / ".cache" / "hidden.jsonl").write_text('{"text": "skipped, as ** skips it"}\n')
    files = match_local_files(str(folder))
    assert [os.path.relpath(f, folder) for f in files] == ["a.txt", "b.jsonl", "c.json", "sub/d.parquet",
                                                           "sub/deeper/e.txt"]
    assert [read for f in files for read in read_documents(f)] == [*expected, last]


def test_local_glob_errors_name_the_pattern_and_files(tmp_path):
    with pytest.raises(ValueError, match="matches no files"):
        match_local_files(str(tmp_path / "*.jsonl"))
    (tmp_path / "x.md").write_text("text\n")
    with pytest.raises(ValueError, match=re.escape(f"training.dataset_path={str(tmp_path)!r} is a folder with no "
                                                   ".txt/.jsonl/.json/.parquet files below it")):
        match_local_files(str(tmp_path))
    (tmp_path / "x.csv").write_text("text\nhello\n")
    with pytest.raises(ValueError, match=r"unsupported files \[.*x\.csv"):
        match_local_files(str(tmp_path / "*"))
    with pytest.raises(ValueError, match="needs training.dataset_path"):
        match_local_files(None)


def test_unknown_dataset_and_workers_on_rank_sharded_sources_are_rejected():
    with pytest.raises(ValueError, match=r"training.dataset='c5' is not one of \['c4', 'local', 'synthetic'\]"):
        build_source("c5", None, 0, 64, 0, 1)
    with pytest.raises(ValueError, match="num_workers=2 with training.dataset='synthetic'"):
        loader("synthetic", workers=2)


def _start_up_log(caplog, dataset: str, path: str | None) -> str:
    with caplog.at_level(logging.INFO):
        loader(dataset, path)
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Dataset ")]
    return line


def test_start_up_log_counts_files_and_bytes_and_documents_only_where_no_file_is_read(local_corpus, caplog,
                                                                                     monkeypatch):
    folder, _ = local_corpus
    monkeypatch.setattr(data, "read_documents", lambda path: pytest.fail(f"describing the dataset read {path}"))
    size = sum(os.path.getsize(f) for f in match_local_files(str(folder)))
    assert _start_up_log(caplog, "local", str(folder)) == (
        f"Dataset 'local' at training.dataset_path={str(folder)!r}: 4 files, {size:,} bytes "
        "(documents not counted: that would read every .jsonl/.json file)")
    caplog.clear()  # .txt files are one document each, parquet files count their rows in the footer
    pattern = str(folder / "**" / "*[dt]")
    size = os.path.getsize(folder / "a.txt") + os.path.getsize(folder / "sub" / "d.parquet")
    assert _start_up_log(caplog, "local", pattern) == (
        f"Dataset 'local' at training.dataset_path={pattern!r}: 2 files, {size:,} bytes, 6 documents")
    caplog.clear()
    assert _start_up_log(caplog, "synthetic", None) == (
        "Dataset 'synthetic': generated recall documents of about 64 characters (seed 0)")


@pytest.fixture
def no_network(monkeypatch):
    """The hub cannot be reached: any connection attempt fails at once, and loading a dataset is an error."""
    calls = []

    def unreachable(request, timeout):
        calls.append((request.full_url, request.get_method(), timeout))
        raise urllib.error.URLError(OSError(-2, "Name or service not known"))

    monkeypatch.setattr(urllib.request, "urlopen", unreachable)
    monkeypatch.setattr("datasets.load_dataset", lambda *a, **k: pytest.fail("c4 went on to load the dataset"))
    for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_ENDPOINT"):
        monkeypatch.delenv(key, raising=False)
    return calls


SUGGESTION = ('Without network, set training.dataset = "local" and training.dataset_path = a folder or glob of '
              ".txt/.jsonl/.json/.parquet files")


@pytest.mark.parametrize("key, value", [("HF_HUB_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "TRUE")])
def test_c4_with_the_hub_switched_off_fails_at_once_suggesting_local(no_network, monkeypatch, key, value):
    monkeypatch.setenv(key, value)
    with pytest.raises(ValueError) as err:
        build_source("c4", None, 0, 64, 0, 1)
    assert str(err.value).startswith(f"training.dataset='c4' streams allenai/c4 from the Hugging Face hub, which "
                                     f"is switched off ({key}={value}). {SUGGESTION}")
    assert no_network == []  # not even one connection attempt


def test_c4_without_network_fails_after_one_bounded_check_suggesting_local(no_network):
    with pytest.raises(ValueError) as err:
        build_source("c4", None, 0, 64, 0, 1)
    assert "which is not reachable at https://huggingface.co (<urlopen error" in str(err.value)
    assert SUGGESTION in str(err.value)
    assert no_network == [("https://huggingface.co", "HEAD", HUB_TIMEOUT_S)]


def test_any_answer_of_the_hub_counts_as_reachable(monkeypatch):
    def forbidden(request, timeout):
        raise urllib.error.HTTPError(request.full_url, 403, "Forbidden", {}, None)

    monkeypatch.setenv("HF_ENDPOINT", "https://hub.example")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(urllib.request, "urlopen", forbidden)
    assert data.check_hub_reachable("allenai/c4") is None


@pytest.fixture
def c4_folder(tmp_path):
    """A local stand-in for C4: a folder of json shards with a 'text' field, as HF datasets reads it."""
    rng = random.Random()
    (tmp_path / "c4").mkdir()
    for shard in range(2):
        rows = [{"text": random_text(rng, rng.randint(30, 300)), "url": "u"} for _ in range(40)]
        (tmp_path / "c4" / f"c4-train.{shard:05d}.json").write_text("\n".join(json.dumps(r) for r in rows))
    return str(tmp_path / "c4")


@pytest.fixture
def sources(local_corpus, c4_folder):
    return {"synthetic": None, "local": str(local_corpus[0]), "c4": c4_folder}


@pytest.mark.parametrize("dataset", sorted(DATASETS))
def test_a_restored_dataloader_continues_with_exactly_the_next_batches(dataset, sources):
    first = loader(dataset, sources[dataset])
    it = iter(first)
    for _ in range(3):
        next(it)
    state = first.state_dict()
    expected = [next(it) for _ in range(4)]
    resumed = loader(dataset, sources[dataset])
    resumed.load_state_dict(state)
    got = list(itertools.islice(iter(resumed), 4))
    for (inp_e, lab_e), (inp_g, lab_g) in zip(expected, got, strict=True):
        assert torch.equal(inp_e["input"], inp_g["input"]) and torch.equal(lab_e, lab_g)
        assert inp_g["input"].shape == (2, 64)


@pytest.mark.parametrize("dataset", sorted(DATASETS))
def test_data_parallel_ranks_see_different_data(dataset, sources):
    batches = [next(iter(loader(dataset, sources[dataset], rank=r, world=2)))[0]["input"] for r in range(2)]
    assert not torch.equal(batches[0], batches[1])


def test_a_data_position_of_another_dataset_is_named_not_a_key_error(local_corpus):
    synthetic = PackedDocuments(build_source("synthetic", None, 0, 64, 0, 1), ByteTokenizer(), 64)
    next(iter(synthetic))
    local = PackedDocuments(LocalFiles(match_local_files(str(local_corpus[0])), 0, 1), ByteTokenizer(), 64)
    with pytest.raises(data.DataError, match=r"^the checkpoint's data position has no 'next' for this dataset \(4 "
                                             r"files, .*\): it was written with another training.dataset"):
        local.load_state_dict(synthetic.state_dict())
