"""What the Spark estimators share: the store (:mod:`.store`), the data written to it and read back by the ranks
(:mod:`.data`), the parameters (:mod:`.params`) and the estimator/model base classes (:mod:`.estimator`)."""

__all__ = ["store", "data", "params", "estimator"]
