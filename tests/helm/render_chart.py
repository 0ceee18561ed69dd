"""Renders charts/switchyard with Helm's Go SDK (helm-python-sdk), as check_chart.py does, and
prints the objects as one JSON list on stdout, for the cluster test's server-side dry-run
(tests/tests/cluster.rs).

    .venv/bin/python tests/helm/render_chart.py default|ha NAMESPACE

`ha` uses charts/switchyard/examples/ha-values.yaml. The release is installed into NAMESPACE.
"""

from __future__ import annotations

import json
import sys

import check_chart
import helm_python as helm


def main() -> int:
    if len(sys.argv) != 3 or sys.argv[1] not in ("default", "ha"):
        print("usage: render_chart.py default|ha NAMESPACE", file=sys.stderr)
        return 2
    values = None
    if sys.argv[1] == "ha":
        values = check_chart.load_values(check_chart.CHART / "examples" / "ha-values.yaml")
    chart = helm.Chart.load(check_chart.CHART)
    files = chart.render(values=values, name=check_chart.RELEASE, namespace=sys.argv[2], is_install=True)
    docs = []
    for path in sorted(files):
        if not path.endswith((".yaml", ".yml")):
            continue
        for doc in check_chart.yaml.safe_load_all(files[path]):
            if doc:
                docs.append(doc)
    json.dump(docs, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
