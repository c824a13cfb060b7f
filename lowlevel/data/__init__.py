"""The data sets: images (digits, MNIST, synthetic), click-through data (MovieLens, synthetic CTR), sharding and input pipelines."""
