"""Where the images come from: CIFAR-100, ImageFolder and synthetic data, their transforms, the DataLoaders,
DALI and on-device augmentation (notebooks 00-05, and every run)."""
