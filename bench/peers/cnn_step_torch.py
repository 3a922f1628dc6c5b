#!/usr/bin/python3
"""PyTorch peer for bench/cnn_step: its convolutional network (three blocks
of 3x3 convolution with padding 1, ReLU and 2x2 max pooling, the channels
doubling from the first block's, then a linear classifier of 10 classes on
32x32 RGB images), trained with SGD (lr 0.01, momentum 0.9) in float32, as
troupe's side: on cuda:0 with TF32 off (cuDNN as PyTorch chooses it), or on
the CPU with the threads troupe's side has (one by default).

Arguments: channels batch device (cpu or cuda:0) [threads, default 1]. It
runs as a server so the C++ benchmark can interleave rounds with its own:
step_server.py's protocol; its ready line says what runs the convolutions.
"""
import os
import sys

THREADS = int(sys.argv[4]) if len(sys.argv) > 4 else 1
for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[key] = str(THREADS)  # before torch's import, which reads them

import torch
import torch.nn as nn
import torch.nn.functional as F

from step_server import serve_steps, training_device

IMAGE, CLASSES, BLOCKS = 32, 10, 3


def convnet(channels):
    layers, inputs, side = [], 3, IMAGE
    for block in range(BLOCKS):
        outputs = channels << block
        layers += [nn.Conv2d(inputs, outputs, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2, 2)]
        inputs, side = outputs, side // 2
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(inputs * side * side, CLASSES))


def main():
    channels, batch = int(sys.argv[1]), int(sys.argv[2])
    device = training_device(sys.argv[3] if len(sys.argv) > 3 else "cpu")
    if device is None:
        return
    if device.type == "cuda":
        convolution = f"cuDNN {torch.backends.cudnn.version()}" if torch.backends.cudnn.is_available() else "no cuDNN"
    else:
        convolution = "oneDNN (mkldnn)" if torch.backends.mkldnn.is_available() else "PyTorch's own CPU kernels"
    torch.set_num_threads(THREADS)
    torch.manual_seed(1)
    model = convnet(channels).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator(device="cpu").manual_seed(7)
    images = torch.randn((batch, 3, IMAGE, IMAGE), generator=g).to(device)
    labels = torch.randint(0, CLASSES, (batch,), generator=g).to(device)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        opt.step()
        return loss.item()  # on a GPU, waits for the step's kernels, as troupe's side

    serve_steps(step, {"torch": torch.__version__, "convolution": convolution})


if __name__ == "__main__":
    main()
