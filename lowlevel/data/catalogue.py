"""The data set a configuration names: images (`images`) or click-through data (`ctr`)."""

from __future__ import annotations

from lowlevel.data import ctr, ctr_files, images


def load_for(config) -> "images.DataSet | ctr.CtrDataSet | ctr_files.CtrFileSet":
    """The data set `config` (a `TrainConfig`) names: `dataset`, `data_dir`, and for the
    click-through sets `hash_buckets` and `vocab_size`.

    Both kinds have `train`, `test`, `name`, `num_classes`, `max_value` and the methods
    `train_iterator`, `eval_input` and `probe_inputs`.

    Raises:
      errors.DataError / errors.MovieLensError: files missing, truncated or malformed.
      errors.UsageError: an unknown name.
    """
    if config.dataset == "movielens":
        return ctr.load_movielens(config.data_dir, config.hash_buckets, seed=0)
    if config.dataset == "criteo_files":
        return ctr_files.load(config.train_files, config.eval_files, config.vocab_size,
                              config.hash_buckets, config.skip_bad_lines)
    if config.dataset == "synthetic_ctr":
        return ctr.synthetic_ctr(config.vocab_size, config.hash_buckets)
    return images.load(config.dataset, config.data_dir)
