"""Train the iris model of the MLServer sample (and of the OIP tests) and save it with joblib.

    python samples/mlserver/train_iris.py samples/mlserver/iris/model.joblib

Run it with the Python of MLServer's virtualenv (``python tests/peer_venvs.py mlserver``
prints it), so that the file matches the scikit-learn that loads it.

A scikit-learn ``LogisticRegression`` fitted on the iris data scikit-learn ships
(``sklearn.datasets.load_iris``): 150 rows of 4 features, classes 0, 1, 2.
"""

from __future__ import annotations

import sys

import joblib
from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression


def main(out: str) -> None:
    features, classes = load_iris(return_X_y=True)
    model = LogisticRegression(max_iter=1000).fit(features, classes)
    joblib.dump(model, out)
    print(f"trained: accuracy {model.score(features, classes):.3f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
