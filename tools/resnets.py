"""Small ResNet-shaped nn.Modules (BasicBlock / Bottleneck stages), written here so the editor's
layout, tests and screenshots can use real model structure without torchvision.

`width` scales every channel count: the editor cares about the graph, not the weights, so tests use
a narrow model that imports in a second.
"""
from __future__ import annotations

import torch
from torch import nn


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or cin != planes:
            self.downsample = nn.Sequential(nn.Conv2d(cin, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        skip = x if self.downsample is None else self.downsample(x)
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + skip)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int = 1):
        super().__init__()
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(cin, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.downsample = None
        if stride != 1 or cin != out:
            self.downsample = nn.Sequential(nn.Conv2d(cin, out, 1, stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x):
        skip = x if self.downsample is None else self.downsample(x)
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)))
        return torch.relu(self.bn3(self.conv3(y)) + skip)


class ResNet(nn.Module):
    def __init__(self, block, counts, width: int = 64, classes: int = 1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        cin, stages = width, []
        for i, n in enumerate(counts):
            planes = width * 2 ** i
            blocks = []
            for j in range(n):
                blocks.append(block(cin, planes, 2 if (j == 0 and i > 0) else 1))
                cin = planes * block.expansion
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.maxpool(torch.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(x.mean((2, 3), keepdim=True), 1))


def resnet18(width: int = 64, classes: int = 1000) -> ResNet:
    return ResNet(BasicBlock, [2, 2, 2, 2], width, classes)


def resnet101(width: int = 64, classes: int = 1000) -> ResNet:
    return ResNet(Bottleneck, [3, 4, 23, 3], width, classes)


def resnet_program(depth: int, width: int = 8, size: int = 32):
    """The imported Program of resnet18 or resnet101 on a [1, 3, size, size] input."""
    from agent_core.importers import import_nn_module
    torch.manual_seed(0)
    model = {18: resnet18, 101: resnet101}[depth](width, classes=10)
    return import_nn_module(model, [torch.randn(1, 3, size, size)], name=f"resnet{depth}")
