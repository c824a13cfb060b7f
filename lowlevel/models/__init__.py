"""The built-in models and what they are made of: dense and convolutional layers, wide & deep, embedding tables, optimizers."""
