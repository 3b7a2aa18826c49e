"""Convolution-bound models (issue 17): memory-bound convs are offered only the fp32 forms
(agent/precision.py), and every conv's form is recorded."""
import textwrap

from agent_core.agent.precision import candidates, library_forms, memory_bound
from agent_core.importers.source import import_file

FIRE = textwrap.dedent('''
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self, cin, sq, e1, e3):
            super().__init__()
            self.squeeze = nn.Conv2d(cin, sq, kernel_size=1)
            self.e1 = nn.Conv2d(sq, e1, kernel_size=1)
            self.e3 = nn.Conv2d(sq, e3, kernel_size=3, padding=1)
            self.dw = nn.Conv2d(e3, e3, kernel_size=3, padding=1, groups=e3)

        def forward(self, x):
            x = torch.relu(self.squeeze(x))
            return torch.cat([torch.relu(self.e1(x)), self.dw(self.e3(x))], 1)

    def get_inputs():
        return [torch.rand(2, 3, 16, 16)]

    def get_init_inputs():
        return [3, 6, 8, 8]
''')


def test_depthwise_and_small_1x1_convs_get_fp32_forms_only(tmp_path):
    f = tmp_path / "fire.py"
    f.write_text(FIRE)
    p = import_file(str(f))
    convs = {p.nodes[n].name: n for n in p.nodes if p.nodes[n].op == "conv2d"}
    dw = next(n for n in convs.values() if p.nodes[n].attrs.get("groups", 1) > 1)
    assert memory_bound(p, dw)
    assert candidates(p, dw) == ["fp32", "fp32-timed"]
    forms = library_forms(p)
    assert set(forms) == set(convs.values())
    assert all(e["form"] == "fp32" for e in forms.values())   # nothing chosen yet: every conv is recorded
    assert forms[dw]["memory_bound"] and forms[dw]["groups"] == 8
