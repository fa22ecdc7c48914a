"""Prepare the course's data: the official CIFAR-100 archive, or tiny data in the same format."""
