"""Criteo-layout files (`lowlevel.data.criteo`, `ctr_files`, `make_criteo`): written lines read
back whole and once per epoch across workers, with the planted signal; a malformed line
stops the read naming its file and line (or is skipped); bad globs and files are one-line
usage errors; wide_deep trains on such files across a launcher's cluster."""

import gzip
import json
import sys

import numpy as np
import pytest
import tensorflow as tf

import clusters
from lowlevel import errors
from lowlevel.data import criteo, ctr, ctr_files

SIZES = ctr.criteo_field_sizes(10_000)


def _labels_in(paths) -> list:
    out = []
    for p in paths:
        with (gzip.open(p, "rt") if p.endswith(".gz") else open(p)) as f:
            out += [int(line.split("\t")[0]) for line in f]
    return out


def _read(paths, batch=64, **kwargs):
    """Every (dense row as bytes, label) the reader yields in one pass (a session's run)."""
    v1 = tf.compat.v1
    with tf.Graph().as_default():
        ds = criteo.dataset(paths, batch, SIZES, 1000, repeat=False, drop_remainder=False,
                            **kwargs)
        next_batch = v1.data.make_one_shot_iterator(ds).get_next()
        rows = []
        with v1.Session() as sess:
            while True:
                try:
                    features, labels = sess.run(next_batch)
                except tf.errors.OutOfRangeError:
                    return rows
                assert features["categorical"].shape[1] == criteo.NUM_CATEGORICAL
                assert np.all((features["categorical"] >= 0) &
                              (features["categorical"] < np.array(SIZES)))
                assert np.all((features["crosses"] >= 0) & (features["crosses"] < 1000))
                rows += [(d.tobytes(), int(l)) for d, l in zip(features["dense"], labels)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("compress", [False, True])
def test_written_lines_read_back_whole_with_their_labels_and_the_planted_signal(
        tmp_path, compress):
    paths = criteo.write_files(str(tmp_path), 2000, num_files=3, seed=3, compress=compress)
    assert [p.endswith(".gz") for p in paths] == [compress] * 3
    rows = _read(paths)
    assert len(rows) == 2000
    assert sorted(l for _, l in rows) == sorted(_labels_in(paths))
    assert 0.2 < np.mean([l for _, l in rows]) < 0.5  # clicks, not all or none
    # the planted signal: labels drawn from the hidden model, which ranks them well
    from sklearn.metrics import roc_auc_score
    _, _, labels, p = criteo._draw(np.random.default_rng(0), 20000, criteo.planted_weights())
    assert abs(labels.mean() - p.mean()) < 0.02
    assert roc_auc_score(labels, p) > 0.75


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_files", [4, 1])  # by file; fewer files than workers: by line
def test_workers_shares_cover_every_line_once_per_epoch(tmp_path, num_files):
    paths = criteo.write_files(str(tmp_path), 1500, num_files=num_files, seed=5)
    whole = _read(paths)
    shares = [_read(paths, num_shards=2, shard=k, shuffle_seed=k) for k in range(2)]
    assert min(len(s) for s in shares) > 0
    assert sorted(shares[0] + shares[1]) == sorted(whole)


def _all(ds) -> list:
    """Every element of `ds` (built in a new graph by the caller), read in a session."""
    v1 = tf.compat.v1
    nxt = v1.data.make_one_shot_iterator(ds).get_next()
    out = []
    with v1.Session() as sess:
        while True:
            try:
                out.append(sess.run(nxt))
            except tf.errors.OutOfRangeError:
                return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("chunk", [7, 64, criteo.CHUNK_BYTES])
def test_lines_from_a_byte_read_as_text_line_dataset_does(tmp_path, monkeypatch, chunk):
    """`criteo.lines_from` (chunks of `CHUNK_BYTES` from a byte, split at newlines): the
    lines `TextLineDataset` gives, across chunk edges, with CRLF, empty lines and a last
    line without a newline; each line's end is the byte after its newline."""
    monkeypatch.setattr(criteo, "CHUNK_BYTES", chunk)
    text = b"ab\tc\r\n\nline three\nx" * 9 + b"\n\nend\r\nno newline"
    path = tmp_path / "f.tsv"
    path.write_bytes(text)
    with tf.Graph().as_default():
        expected = _all(tf.data.TextLineDataset(str(path)))
    starts = [0] + [i + 1 for i, c in enumerate(text) if c == ord("\n")]
    for line in (0, 1, 5, len(expected) - 1):
        with tf.Graph().as_default():
            got = _all(criteo.lines_from(str(path), starts[line], len(text)))
        assert [x for x, _ in got] == expected[line:], line
        assert [e for _, e in got] == starts[line + 1:] + [len(text)], line


@pytest.mark.timeout(60)
def test_a_span_resumed_from_its_hint_reads_what_a_read_from_line_0_does(tmp_path):
    """The data queue's resume hint (`start`: a line and its byte) changes where a span is
    read from, not what is read: the batches from line 150 are the same either way, and
    each batch's end byte is where its next line begins."""
    path = criteo.write_files(str(tmp_path), 400, num_files=1, seed=3)[0]
    with open(path, "rb") as f:
        starts = [0, *np.cumsum([len(line) for line in f])]

    def batches(start):
        with tf.Graph().as_default():
            got = _all(criteo.span_batches(tf.constant([path]), tf.constant(150, tf.int64),
                                           tf.constant(start, tf.int64), 64, SIZES, 1000))
        for (_, _), (first, n, end) in got:
            assert end == starts[first + n]
        return [(f["dense"].tobytes(), labels.tobytes(), first, n)
                for (f, labels), (first, n, _) in got]

    whole = batches([0, 0, int(starts[-1])])
    assert [b[2] for b in whole] == [150, 214, 278, 342] and whole[-1][3] == 58
    assert batches([120, int(starts[120]), int(starts[-1])]) == whole



@pytest.mark.timeout(30)
def test_a_spans_dataset_has_no_autotune_thread_to_wait_for_and_no_rewrites():
    """A span's iterator is re-initialized for every span and dropped with its session: with
    autotuning on, that waited for the model thread's sleep (11.9 s after 70 s of reading,
    50-60 s in 90 M-line sync runs; benchmarks/NOTES.md), and each initialization ran the
    default rewrites' Grappler pass. Both are off for a span's dataset."""
    with tf.Graph().as_default():
        ds = criteo.span_batches(tf.constant(["x.tsv"]), tf.constant(0, tf.int64),
                                 tf.constant([0, 0, 0], tf.int64), 64, SIZES, 1000)
        options = ds.options()
    assert options.autotune.enabled is False
    assert options.experimental_optimization.apply_default_optimizations is False

def _with_bad_line(tmp_path, line_number: int, bad: str):
    paths = criteo.write_files(str(tmp_path), 200, num_files=1, seed=1)
    with open(paths[0]) as f:
        lines = f.readlines()
    lines[line_number - 1] = bad + "\n"
    with open(paths[0], "w") as f:
        f.writelines(lines)
    return paths


@pytest.mark.timeout(60)
@pytest.mark.parametrize("bad", ["1\t2\t3", "x" + "\t1" * 13 + "\tab" * 26,
                                 "0" + "\t1.5" * 13 + "\tab" * 26])
def test_a_malformed_line_stops_the_read_naming_file_and_line_or_is_skipped(tmp_path, bad):
    paths = _with_bad_line(tmp_path, 137, bad)
    with pytest.raises(tf.errors.InvalidArgumentError) as e:
        _read(paths)
    assert paths[0] in str(e.value) and "line" in str(e.value) and "137" in str(e.value)
    assert len(_read(paths, skip_bad_lines=True)) == 199


@pytest.mark.timeout(60)
def test_bad_globs_and_files_are_one_line_usage_errors(tmp_path):
    paths = criteo.write_files(str(tmp_path / "a"), 100, seed=1)
    gz = criteo.write_files(str(tmp_path / "b"), 100, seed=1, compress=True)
    with pytest.raises(errors.UsageError, match="--train_files=.*nothing.*: no file matches"):
        ctr_files.load(str(tmp_path / "nothing*"), paths[0], 100, 10)
    with pytest.raises(errors.UsageError, match="mixes .gz and plain"):
        ctr_files.load(f"{paths[0]},{gz[0]}", paths[0], 100, 10)
    (tmp_path / "notes.txt").write_text("label,a,b\n1,2,3\n")
    with pytest.raises(errors.UsageError, match="--eval_files: .*notes.txt line 1 is not"):
        ctr_files.load(paths[0], str(tmp_path / "notes.txt"), 100, 10)
    truncated = tmp_path / "cut.tsv.gz"
    truncated.write_bytes(open(gz[0], "rb").read()[:12])
    with pytest.raises(errors.UsageError, match="cannot read .*cut.tsv.gz"):
        ctr_files.load(str(truncated), paths[0], 100, 10)
    data = ctr_files.load(str(tmp_path / "a" / "*"), gz[0], 100, 10)
    assert data.train.files == tuple(paths) and "1 file(s)" in data.description


LAUNCH = [sys.executable, "-m", "lowlevel.launch", "--num_ps=1", "--num_workers=2",
          "--no_isolation", "--model=wide_deep", "--dataset=criteo_files"]


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_wide_deep_trains_on_criteo_files_across_a_cluster(tmp_path):
    make = [sys.executable, "-m", "lowlevel.data.make_criteo"]
    result = clusters.run(make + [f"--output_dir={tmp_path / 'train'}", "--rows=60000",
                                  "--files=4"], timeout=60)
    assert result.returncode == 0 and "wrote 60,000 lines in 4 file(s)" in result.stdout, result
    result = clusters.run(make + [f"--output_dir={tmp_path / 'test'}", "--rows=10000",
                                  "--seed=9", "--gzip"], timeout=60)
    assert result.returncode == 0, result
    out = tmp_path / "out"
    files = [f"--train_files={tmp_path / 'train' / '*.tsv'}",
             f"--eval_files={tmp_path / 'test' / '*'}"]
    result = clusters.run(LAUNCH + files + ["--train_steps=1500", "--batch_size=128",
                                            f"--output_dir={out}"], timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    metrics = json.loads((out / "final_metrics.json").read_text())
    assert metrics["global_step"] == 1500 and metrics["dataset"] == "criteo_files"
    assert metrics["auc"] > 0.6, metrics  # the planted signal, learned from the files
    assert not clusters.leftovers(out)
    # a glob that matches nothing: one line, exit 2, nothing started
    bad = clusters.run(LAUNCH + [f"--train_files={tmp_path / 'none*'}", files[1],
                                 f"--output_dir={tmp_path / 'never'}"], timeout=60)
    assert bad.returncode == 2 and "--train_files=" in bad.stderr, bad
    assert "Traceback" not in bad.stderr and not (tmp_path / "never").exists()
