"""Names the bench command line needs before anything heavy is imported."""

#: The metrics a grid may rank by (central evaluation's keys).
METRICS = ("balanced_accuracy", "accuracy", "auc", "macro_f1", "worst_class_recall", "rare_class_macro_f1")
