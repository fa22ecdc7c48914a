"""Prepare the course's data: the official CIFAR-100 and ImageNet archives, or tiny data in the same formats."""
