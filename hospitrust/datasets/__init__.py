"""Data: dataset sources behind a registry (MedMNIST, torchvision), a hospital's own image
folders, partitioners with their options, and the simulated federation's shares and the
server's own sets.
"""
