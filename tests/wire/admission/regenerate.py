"""Rewrite the expected answers of the golden admission cases from the current code.

Run ``.venv/bin/python -m tests.wire.admission.regenerate`` after a deliberate change and
review the diff like code (multidict's ``gen_pickles.py`` habit). Requests are never
rewritten: they are what kube-apiserver sends.
"""

from __future__ import annotations

import base64
import json

from tests.wire.admission import cases


def main() -> None:
    cluster = cases.load_cluster()
    for case in cases.all_cases():
        got = cases.answer(case, cluster)
        if isinstance(got, str):
            case.error.write_text(got + "\n")
            print(f"{case.name}: error")
            continue
        case.response.write_text(json.dumps(got, indent=2, ensure_ascii=False) + "\n")
        patch = got["response"].get("patch")
        if patch is not None:
            ops = json.loads(base64.b64decode(patch))
            case.patch.write_text(json.dumps(ops, indent=2, ensure_ascii=False) + "\n")
        elif case.patch.exists():
            case.patch.unlink()
        print(f"{case.name}: allowed={got['response']['allowed']}")


if __name__ == "__main__":
    main()
