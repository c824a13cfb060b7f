"""Click logs in Criteo's layout, in files: a generator with a planted signal, and a reader.

The layout (Criteo's Kaggle display-advertising and Terabyte click logs): one example per
line, tab-separated, 40 fields:

    label   I1 ... I13   C1 ... C26
    0/1     integers     32-bit hashes as 8 hex digits

An integer or a hash may be empty (missing). A file whose name ends in `.gz` is gzip.

`write_files` writes such files at any size, chunk by chunk (memory stays at one chunk,
`CHUNK_ROWS` rows): hashes Zipf-distributed per field (exponent 1.1, as
`ctr.synthetic_ctr`), counts exponential, and each label drawn from a hidden logistic
model of the hashes and counts, so a model's test AUC says whether it learned (the
planted signal; `ctr.synthetic_ctr`'s, computed from the hash values). Every field it
writes has a fixed width (counts zero-padded to 5 digits): the reader takes any width.

`dataset` reads files of this layout in a worker's graph (`tf.data`: lines checked by one
regular expression and parsed by `decode_csv`, a batch at a time) into `wide_deep`'s
features: `dense` float32 `[B, 13]` (log(1 + max(I, 0)) / 10; missing: 0), `categorical`
int64 `[B, 26]` (field f's hash string, farmhashed, modulo `field_sizes[f]`; missing: the
empty string's row),
`crosses` int64 `[B, 3]` (pairs of fields hashed into `hash_buckets`, as
`ctr.synthetic_ctr`'s), labels int64 `[B]`. A line without 40 fields, a label that is not
0 or 1, or a count that is not an integer stops the run with `tf.errors.InvalidArgumentError`
naming the file and line (`skip_bad_lines=True`: dropped instead).
"""

from __future__ import annotations

import glob as glob_lib
import gzip
import os
from typing import Optional, Sequence

import numpy as np

from lowlevel import errors
from lowlevel.data import replaceable

NUM_INTEGER = 13
NUM_CATEGORICAL = 26
NUM_FIELDS = 1 + NUM_INTEGER + NUM_CATEGORICAL
CROSSES = ((0, 1), (2, 3), (5, 8))  # categorical field pairs crossed in the wide part
CROSS_NAMES = tuple(f"C{a + 1}xC{b + 1}" for a, b in CROSSES)
CHUNK_ROWS = 1 << 16
INT_DIGITS = 5  # the generator's counts: 0 .. 99999, zero-padded
ZIPF_EXPONENT = 1.1
PLANTED_SEED = 4321  # the hidden model's count weights
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def resolve(patterns: str, flag: str) -> list[str]:
    """The sorted files matching comma-separated glob `patterns`.

    Raises:
      errors.UsageError: a pattern matches nothing, or gzip and plain files are mixed
        (one `tf.data` reader reads them all with one compression), naming `flag`.
    """
    files = []
    for pattern in [p for p in patterns.split(",") if p]:
        matched = sorted(f for f in glob_lib.glob(pattern) if os.path.isfile(f))
        if not matched:
            raise errors.UsageError(f"{flag}={pattern}: no file matches it")
        files.extend(matched)
    if not files:
        raise errors.UsageError(f"{flag}: no file given")
    if len({f.endswith(".gz") for f in files}) > 1:
        raise errors.UsageError(f"{flag}: mixes .gz and plain files; give one kind")
    return files


def check_readable(path: str, flag: str) -> None:
    """Reads `path`'s first line (decompressed for `.gz`) and checks its layout.

    Raises:
      errors.UsageError: the file cannot be opened or decompressed, or its first line is
        not a Criteo-layout line (naming `flag`, the file, and what was found).
    """
    import re
    try:
        with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as f:
            first = f.readline(1 << 16)
    except (OSError, EOFError) as e:
        raise errors.UsageError(f"{flag}: cannot read {path}: {e}") from None
    text = first.rstrip(b"\r\n").decode("utf-8", "replace")
    if first and not re.fullmatch(LINE, text):
        raise errors.UsageError(
            f"{flag}: {path} line 1 is not a Criteo-layout line (a 0/1 label, 13 integers "
            f"and 26 hex hashes, tab-separated; it has {text.count(chr(9)) + 1} fields): "
            f"{text[:80]!r}")


def write_files(out_dir: str, num_rows: int, num_files: int = 1, seed: int = 0,
                compress: bool = False, prefix: str = "day") -> list[str]:
    """Writes `num_rows` Criteo-layout lines over `num_files` files in `out_dir`.

    Files are `<prefix>_<k>.tsv` (`.tsv.gz` with `compress`), rows split as evenly as can
    be. Each file is written to a temporary name and renamed when complete. 314 bytes a
    row before compression (152 gzipped). Deterministic in (`num_rows`, `num_files`,
    `seed`); the hidden model does not depend on `seed`.

    Returns:
      The paths written, in order.
    """
    os.makedirs(out_dir, exist_ok=True)
    weights = planted_weights()  # two seeds' files: two splits of one task
    paths, start = [], 0
    for k in range(num_files):
        rows = num_rows // num_files + (1 if k < num_rows % num_files else 0)
        path = os.path.join(out_dir, f"{prefix}_{k}.tsv" + (".gz" if compress else ""))
        tmp = path + ".tmp"
        with (gzip.open(tmp, "wb", compresslevel=1) if compress else open(tmp, "wb")) as f:
            for first in range(start, start + rows, CHUNK_ROWS):
                n = min(CHUNK_ROWS, start + rows - first)
                f.write(_chunk(np.random.default_rng([seed, first]), n, weights))
        os.replace(tmp, path)
        paths.append(path)
        start += rows
    return paths


def _draw(rng: np.random.Generator, n: int, weights: np.ndarray):
    """`n` examples: hashes uint64-valued int `[n, 26]`, counts float `[n, 13]`, labels
    uint8 `[n]`, and the planted click probability float `[n]` they were drawn with."""
    ranks = np.minimum(rng.zipf(ZIPF_EXPONENT, size=(n, NUM_CATEGORICAL)) - 1, 2**40)
    hashes = (ranks * 2654435761 + 97 * np.arange(NUM_CATEGORICAL)) % (2**32)
    counts = np.minimum(np.floor(rng.exponential(20.0, size=(n, NUM_INTEGER))), 99999)
    p = _click_probability(hashes, counts, weights)
    return hashes, counts, (rng.random(n) < p).astype(np.uint8), p


def _chunk(rng: np.random.Generator, n: int, weights: np.ndarray) -> bytes:
    """`n` lines of the layout as bytes: a [n, width] byte matrix, built column by column."""
    hashes, counts, labels, _ = _draw(rng, n, weights)
    columns = [(labels + ord("0"))[:, None]]
    for i in range(NUM_INTEGER):
        columns += [_tab(n), _digits(counts[:, i].astype(np.int64), INT_DIGITS)]
    for i in range(NUM_CATEGORICAL):
        columns += [_tab(n), _hex(hashes[:, i].astype(np.uint64))]
    columns.append(np.full((n, 1), ord("\n"), np.uint8))
    return np.concatenate(columns, axis=1).tobytes()


def planted_weights() -> np.ndarray:
    """The hidden model's count weights, float32 `[13]` (the same for every file)."""
    return np.random.default_rng(PLANTED_SEED).standard_normal(NUM_INTEGER).astype(np.float32)


def _click_probability(hashes: np.ndarray, counts: np.ndarray, weights: np.ndarray):
    """The planted signal: a logistic model of a weight per hash value (from the value,
    uniform in [-1, 1]) and of the log counts."""
    mixed = (hashes * 0x9E3779B1 + np.arange(NUM_CATEGORICAL) * 0x85EBCA77) % (2**31 - 1)
    id_weights = (mixed % 2001) / 1000.0 - 1.0
    dense = np.log1p(counts) / 10.0
    z = dense @ weights * 2.0 + id_weights.sum(axis=1) * 0.6 - 2.0
    return 1.0 / (1.0 + np.exp(-z))


def _tab(n: int) -> np.ndarray:
    return np.full((n, 1), ord("\t"), np.uint8)


def _digits(values: np.ndarray, width: int) -> np.ndarray:
    out = np.empty((len(values), width), np.uint8)
    for j in range(width - 1, -1, -1):
        out[:, j] = values % 10 + ord("0")
        values = values // 10
    return out


def _hex(values: np.ndarray) -> np.ndarray:
    return np.stack([_HEX[(values >> np.uint64(4 * (7 - j))) & np.uint64(15)]
                     for j in range(8)], axis=1)


def dataset(files: Sequence[str], batch_size: int, field_sizes: Sequence[int],
            hash_buckets: int, num_shards: int = 1, shard: int = 0,
            shuffle_seed: Optional[int] = None, repeat: bool = True,
            drop_remainder: bool = True, skip_bad_lines: bool = False):
    """A `tf.data.Dataset` of (features, labels) batches read from `files` (see the module doc).

    Lines are read and parsed a batch of one file's consecutive lines at a time (per-line
    work in `tf.data` costs more than the parse), then rebatched to `batch_size`.

    Args:
      files: paths (all `.gz` or none; `resolve` checks).
      field_sizes: rows of each of the 26 categorical fields' tables.
      num_shards, shard: this reader takes every `num_shards`-th file from `shard`
        (fewer files than shards: every `num_shards`-th line of each file instead).
      shuffle_seed: None reads in order; else the order of the files and of their batches
        (a window of 16) is shuffled, anew each epoch.
      repeat: epochs forever (training) or one pass (evaluation).
    """
    import tensorflow as tf
    compression = "GZIP" if files[0].endswith(".gz") else ""
    by_line = len(files) < num_shards
    stride = num_shards if by_line else 1  # file lines between two lines this reader takes
    names = tf.data.Dataset.from_tensor_slices(list(files))
    if not by_line:
        names = names.shard(num_shards, shard)
    if shuffle_seed is not None:
        names = names.shuffle(len(files), seed=shuffle_seed, reshuffle_each_iteration=True)

    def batches(name):
        ds = tf.data.TextLineDataset(name, compression_type=compression)
        if by_line:
            ds = ds.shard(num_shards, shard)
        first = shard + 1 if by_line else 1  # the file line of this reader's first line
        return ds.batch(batch_size).enumerate().map(
            _plain(lambda i, lines: (name, first + i * batch_size * stride, lines)))

    ds = names.interleave(_plain(batches), cycle_length=min(4, len(files)),
                          num_parallel_calls=tf.data.AUTOTUNE,
                          deterministic=shuffle_seed is None)
    if shuffle_seed is not None:
        ds = ds.shuffle(16, seed=shuffle_seed, reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()
    parse = _parser(tuple(field_sizes), hash_buckets, stride, skip_bad_lines)
    ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.rebatch(batch_size, drop_remainder=drop_remainder).prefetch(tf.data.AUTOTUNE)


def span_batches(file, skip, start, batch_size: int, field_sizes: Sequence[int],
                 hash_buckets: int, compression: str = "", skip_bad_lines: bool = False):
    """The batches of one span (`spans.SpanInput`): string [k] `file` (k = 0: none) read in
    order from line `skip` (int64 scalar, 0-based) to its end, the last batch partial.

    `start` (int64 [3]): (line, byte, size): line `line` (<= `skip`) of the file begins at
    byte `byte` (the queue's resume hint; (0, 0) knows nothing), and the file has `size`
    bytes. An uncompressed file is read from that byte (`lines_from`), so a worker
    resuming a span deep in a large file does not read every line before it (1.3 s per
    million lines here; a Criteo day has 45 million). A gzip file is read from its start.

    Returns:
      A `tf.data.Dataset` of ((features, labels), (first, n, end)): the batch's first line
      (0-based, int64), its lines read (int64; with `skip_bad_lines` the bad ones count)
      and the byte after its last line (int64; -1 for gzip): the next resume hint.
    """
    import tensorflow as tf
    parse = _parser(tuple(field_sizes), hash_buckets, 1, skip_bad_lines)

    def batches(name):
        if compression:  # no seeking: no end bytes
            lines = tf.data.Dataset.zip((
                tf.data.TextLineDataset(name, compression_type=compression),
                tf.data.Dataset.from_tensors(tf.constant(-1, tf.int64)).repeat())).skip(skip)
        else:
            lines = lines_from(name, start[1], start[2]).skip(skip - start[0])
        return lines.batch(batch_size).enumerate().map(
            _plain(lambda i, batch: (name, skip + i * batch_size, batch[0], batch[1][-1])))

    def parsed(name, first, lines, end):
        return parse(name, first + 1, lines), (first, tf.size(lines, out_type=tf.int64), end)

    ds = tf.data.Dataset.from_tensor_slices(file).flat_map(_plain(batches))
    ds = ds.map(_plain(parsed), num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
    # made anew for every span: no autotune thread to wait for when it is dropped, and no
    # default rewrites (Grappler on the dataset's graph, ~50 ms of CPU, at every span)
    return replaceable.without_autotune(ds, default_rewrites=False)


CHUNK_BYTES = 1 << 20  # `lines_from` reads this much at a time


def lines_from(name, byte, size):
    """The lines of the uncompressed file `name` (string scalar) of `size` bytes, from byte
    `byte` (a line's start; both int64) to its end, as `tf.data.TextLineDataset` gives
    them (no newline, a carriage return before it dropped, a last line without one kept),
    each with the byte after its newline (int64): a `tf.data.Dataset` of (line, end).

    Read `CHUNK_BYTES` at a time (`FixedLengthRecordDataset` from `byte`, the remainder
    as one short record, so no byte before `byte` is read), split at newlines, each
    chunk's unfinished last line carried to the next.
    """
    import tensorflow as tf
    byte, size = tf.cast(byte, tf.int64), tf.cast(size, tf.int64)
    rest = tf.math.floormod(size - byte, CHUNK_BYTES)
    body = tf.data.FixedLengthRecordDataset(name, CHUNK_BYTES, header_bytes=byte,
                                            footer_bytes=rest)
    short = tf.maximum(rest, 1)
    tail = tf.data.FixedLengthRecordDataset(name, short, header_bytes=tf.maximum(
        size - short, 0)).take(tf.cast(rest > 0, tf.int64))
    chunks = body.concatenate(tail).map(_plain(lambda c: (c, False))).concatenate(
        tf.data.Dataset.from_tensors((tf.constant(""), True)))

    def split(state, chunk):
        carry, at = state
        text, last = chunk
        parts = tf.strings.split(carry + text, "\n")
        whole = parts[:-1]
        lengths = tf.cast(tf.strings.length(whole), tf.int64) + 1  # bytes, with the newline
        ends = at + tf.cumsum(lengths)
        n_last = tf.cast(tf.logical_and(last, tf.strings.length(parts[-1]) > 0), tf.int32)
        lines = tf.concat([whole, parts[-1:][:n_last]], 0)  # the last line, at the end
        ends = tf.concat([ends, tf.fill([n_last], size)], 0)
        lines = tf.strings.regex_replace(lines, "\r$", "")
        return (parts[-1], at + tf.reduce_sum(lengths)), (lines, ends)

    return chunks.scan((tf.constant(""), byte), _plain(split)).unbatch()


# A well-formed line: the label, 13 integers (or empty), 26 hex hashes (or empty).
LINE = "[01](\t-?[0-9]*){13}(\t[0-9a-fA-F]*){26}"


def _parser(field_sizes: tuple, hash_buckets: int, stride: int, skip_bad_lines: bool):
    """(file name, file line of the first, lines) of one file -> (features, labels)."""
    import tensorflow as tf

    def parse(name, first_line, lines):
        good = tf.strings.regex_full_match(lines, LINE)
        if skip_bad_lines:
            lines = tf.boolean_mask(lines, good)
        else:
            bad = tf.argmin(tf.cast(good, tf.int32))
            check = tf.debugging.Assert(tf.reduce_all(good), [
                "malformed line (expected a 0/1 label, 13 integers and 26 hex hashes, "
                "tab-separated): file", name, "line", first_line + bad * stride], summarize=3)
            with tf.control_dependencies([check]):
                lines = tf.identity(lines)
        return _features(lines, field_sizes, hash_buckets)

    return _plain(parse)


def _plain(fn):
    """`fn` for `tf.data` as written: not converted by AutoGraph, which transpiles each
    function's Python source at graph build (the reader's functions have no Python
    control flow on tensors): ~20 % of a worker's graph build, measured with py-spy
    (benchmarks/NOTES.md), on the restart and join path."""
    import tensorflow as tf
    return tf.autograph.experimental.do_not_convert(fn)


def _features(lines, field_sizes: tuple, hash_buckets: int):
    """(features, labels) of well-formed `lines` (string `[n]`)."""
    import tensorflow as tf
    defaults = ([tf.constant(0, tf.int64)] + [tf.constant(0.0)] * NUM_INTEGER +
                [tf.constant("")] * NUM_CATEGORICAL)
    columns = tf.io.decode_csv(lines, defaults, field_delim="\t", na_value="")
    counts = tf.stack(columns[1:1 + NUM_INTEGER], axis=1)
    dense = tf.math.log1p(tf.maximum(counts, 0.0)) / 10.0
    hashed = tf.strings.to_hash_bucket_fast(tf.stack(columns[1 + NUM_INTEGER:], axis=1), 2**62)
    categorical = hashed % tf.constant(field_sizes, tf.int64)
    crosses = tf.stack([(categorical[:, a] * 1_000_003 + categorical[:, b]) % hash_buckets
                        for a, b in CROSSES], axis=1)
    return {"dense": dense, "categorical": categorical, "crosses": crosses}, columns[0]
