"""A graph built for a cluster, run in one process: the same ops, minus where they run."""

import contextlib

import tensorflow as tf

v1 = tf.compat.v1


@contextlib.contextmanager
def session_without_devices(graph: tf.Graph):
    """A session on a copy of `graph` whose ops (its functions' too) name no device and no
    colocation; fetch and run by name (`tensor.name`, `op.name`)."""
    graph_def = graph.as_graph_def()
    nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
    for node in nodes:
        node.device = ""
        if "_class" in node.attr:  # colocation with a variable's ps
            del node.attr["_class"]
    with tf.Graph().as_default() as g, v1.Session(graph=g) as sess:
        tf.graph_util.import_graph_def(graph_def, name="")
        yield sess
