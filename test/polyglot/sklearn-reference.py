"""The independent side of test/polyglot/evaluation-metrics.test.ts.

Reads the fixtures the test wrote (a JSON file named on the command line) and
prints, as JSON, what scikit-learn (Debian's python3-sklearn), numpy and scipy
compute on them. Nothing here is copied from the TypeScript: each figure comes
from the library's own function where one exists.
"""
import json
import sys

import numpy as np
from scipy.optimize import minimize, minimize_scalar
from scipy.special import logsumexp
from sklearn import __version__ as sklearn_version
from sklearn.calibration import _sigmoid_calibration, calibration_curve
from sklearn.isotonic import IsotonicRegression
from sklearn.metrics import (
    accuracy_score,
    brier_score_loss,
    confusion_matrix,
    f1_score,
    log_loss,
    mean_absolute_error,
    roc_auc_score,
)


def reliability(correct, confidence):
    """ECE from calibration_curve's bins (uniform, 10), weighted by each bin's count."""
    prob_true, prob_pred = calibration_curve(correct, confidence, n_bins=10, strategy="uniform")
    # calibration_curve returns the non-empty bins only; their counts, by its own bin rule.
    bins = np.linspace(0.0, 1.0, 11)
    counts = np.bincount(np.searchsorted(bins[1:-1], confidence), minlength=10)
    nonempty = counts[counts > 0]
    ece = float(np.sum(nonempty / len(confidence) * np.abs(prob_pred - prob_true)))
    return {"ece": ece, "counts": counts.tolist(), "meanPredicted": prob_pred.tolist(), "observedFrequency": prob_true.tolist()}


def noul(fixture):
    p = np.array(fixture["p"], dtype=np.float64)
    y = np.array(fixture["y"], dtype=int)
    return {
        "accuracy": float(accuracy_score(y, (p >= 0.5).astype(int))),
        "brier": float(brier_score_loss(y, p)),
        "logLoss": float(log_loss(y, p)),
        "auroc": float(roc_auc_score(y, p)),
        "reliability": reliability(y, p),
    }


def distribution(fixture):
    probabilities = np.array(fixture["probabilities"], dtype=np.float64)
    y = np.array(fixture["labels"], dtype=int)
    k = probabilities.shape[1]
    predicted = np.argmax(probabilities, axis=1)
    onehot = np.eye(k)[y]
    confidence = probabilities[np.arange(len(y)), predicted]
    return {
        "accuracy": float(accuracy_score(y, predicted)),
        "macroF1": float(f1_score(y, predicted, average="macro")),
        "confusion": confusion_matrix(y, predicted, labels=list(range(k))).tolist(),
        "logLoss": float(log_loss(y, probabilities, labels=list(range(k)))),
        # sklearn 1.2's brier_score_loss is binary only: Brier's own multi-class score, with numpy.
        "brier": float(np.mean(np.sum((probabilities - onehot) ** 2, axis=1))),
        "meanAbsoluteError": float(mean_absolute_error(y, predicted)),
        "reliability": reliability((predicted == y).astype(int), confidence),
    }


def isotonic(fixture):
    regression = IsotonicRegression(out_of_bounds="clip").fit(fixture["x"], fixture["y"])
    return {
        "x": regression.X_thresholds_.tolist(),
        "y": regression.y_thresholds_.tolist(),
        "predictions": regression.predict(fixture["at"]).tolist(),
    }


def platt(fixture):
    a, b = _sigmoid_calibration(np.array(fixture["x"], dtype=np.float64), np.array(fixture["y"], dtype=int))
    # sklearn's model is 1 / (1 + exp(a·x + b)): our slope and intercept are −a and −b.
    at = np.array(fixture["at"], dtype=np.float64)
    return {"slope": float(-a), "intercept": float(-b), "predictions": (1.0 / (1.0 + np.exp(a * at + b))).tolist()}


def temperature(fixture):
    logits = np.log(np.maximum(np.array(fixture["probabilities"], dtype=np.float64), fixture["floor"]))
    y = np.array(fixture["labels"], dtype=int)
    rows = np.arange(len(y))

    def loss(log_beta):
        scaled = np.exp(log_beta) * logits
        return float(np.sum(logsumexp(scaled, axis=1) - scaled[rows, y]))

    result = minimize_scalar(loss, bounds=(-10, 10), method="bounded", options={"xatol": 1e-12})
    return {"temperature": float(np.exp(-result.x))}


def vector(fixture):
    logits = np.log(np.maximum(np.array(fixture["probabilities"], dtype=np.float64), fixture["floor"]))
    y = np.array(fixture["labels"], dtype=int)
    rows = np.arange(len(y))
    k = logits.shape[1]
    onehot = np.eye(k)[y]

    def loss_and_gradient(theta):
        scaled = theta[0] * logits + theta[1:]
        normaliser = logsumexp(scaled, axis=1)
        q = np.exp(scaled - normaliser[:, None])
        loss = np.sum(normaliser - scaled[rows, y]) + 0.5 * fixture["biasPrecision"] * np.sum(theta[1:] ** 2)
        gradient = np.concatenate([[np.sum((q - onehot) * logits)], np.sum(q - onehot, axis=0) + fixture["biasPrecision"] * theta[1:]])
        return float(loss), gradient

    result = minimize(loss_and_gradient, np.concatenate([[1.0], np.zeros(k)]), jac=True, method="BFGS", options={"gtol": 1e-10})
    return {"temperature": float(1.0 / result.x[0]), "biases": result.x[1:].tolist()}


fixtures = json.load(open(sys.argv[1]))
print(
    json.dumps(
        {
            "sklearn": sklearn_version,
            "noul": noul(fixtures["noul"]),
            "choice": distribution(fixtures["choice"]),
            "score": distribution(fixtures["score"]),
            "isotonic": isotonic(fixtures["isotonic"]),
            "platt": platt(fixtures["platt"]),
            "temperature": temperature(fixtures["temperature"]),
            "vector": vector(fixtures["vector"]),
        }
    )
)
