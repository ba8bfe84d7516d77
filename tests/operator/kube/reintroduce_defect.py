"""Put one of issue 17's five defects back into the working tree, to show the suite catches it.

    python -P tests/operator/kube/reintroduce_defect.py N     # N = 1, 2, 3, 4, 5a, 5b
    python -P -m pytest -q -p no:cacheprovider tests/operator/kube/<the test README.md names>
    git checkout -- operator charts                            # revert

Each defect is the smallest edit that restores the old behaviour (the CRDs are regenerated where
the defect lives in the generator or the models). Run it on a clean tree only. Not a test module:
tests/operator/kube/README.md records what each one made fail, and when.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def sub(path: str, old: str, new: str) -> None:
    p = REPO / path
    text = p.read_text()
    if old not in text:
        raise SystemExit(f"{path}: the code changed, this defect's patch no longer applies")
    p.write_text(text.replace(old, new, 1))


def regenerate_crds() -> None:
    subprocess.run([str(Path(sys.executable).with_name("ttsfleet")), "operator", "crds", "--out",
                    str(REPO / "charts/ttsfleet/crds")], check=True, capture_output=True)


def defect_1() -> None:
    """Namespaced mode: pods listed (and watched) only inside the watched namespaces' Roles."""
    p = REPO / "charts/ttsfleet/templates/rbac.yaml"
    text = p.read_text()
    cluster_pods = re.compile(r'(# Every pod on every GPU node[^\n]*\n(?:#[^\n]*\n)*)?- apiGroups: \[""\]\n'
                              r'  resources: \["pods"\]\n  verbs: \[(?P<verbs>"list"[^\]]*)\]\n')
    found = cluster_pods.search(text)
    if found is None or "ttsfleet.rbac.namespacedRules" not in text[found.end():]:
        raise SystemExit("rbac.yaml: the code changed, this defect's patch no longer applies")
    p.write_text(text[:found.start()] + text[found.end():])
    sub("charts/ttsfleet/templates/rbac.yaml", 'resources: ["pods"]\n  verbs: ["create", "patch", "delete"]',
        f'resources: ["pods"]\n  verbs: [{found["verbs"]}, "create", "patch", "delete"]')


def defect_2() -> None:
    """No ``update`` on the owners' finalizers (children's blockOwnerDeletion needs it)."""
    sub("charts/ttsfleet/templates/rbac.yaml", '- apiGroups: ["ttsfleet.io"]\n'
        '  resources: ["ttsdeployments/finalizers", "filljobs/finalizers"]\n  verbs: ["update"]\n', "")


def defect_3() -> None:
    """Object defaults written as ``{}``: the nested class's defaults (32Gi) instead of the field's (16Gi)."""
    sub("operator/crds.py", 'node["default"] = _without_none(node["default"])', 'node["default"] = {}')
    regenerate_crds()


def defect_4() -> None:
    """No CEL rules on the objects' names and on tolerations."""
    sub("operator/crds.py", '"x-kubernetes-validations": NAME_RULES[kind],', "")
    sub("operator/models.py", 'model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [\n'
        '        {"rule": "(has(self.operator)', 'model_config = ConfigDict(json_schema_extra={"x-kubernetes-'
        'validations": [] and [\n        {"rule": "(has(self.operator)')
    regenerate_crds()


def defect_5a() -> None:
    """Quantities as the user spelled them (``0.5``), not as the API server stores them (``500m``)."""
    sub("operator/models.py", "        return quantity.canonical(value)", "        return value")
    regenerate_crds()


def defect_5b() -> None:
    """Empty maps sent (``nodeSelector: {}``), which the API server drops."""
    sub("operator/desired.py",
        '**({"nodeSelector": dict(spec.node_selector)} if spec.node_selector else {}),',
        '"nodeSelector": dict(spec.node_selector),')


DEFECTS = {"1": defect_1, "2": defect_2, "3": defect_3, "4": defect_4, "5a": defect_5a, "5b": defect_5b}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in DEFECTS:
        print(f"usage: reintroduce_defect.py {{{','.join(DEFECTS)}}}", file=sys.stderr)
        raise SystemExit(2)
    DEFECTS[sys.argv[1]]()
