"""The ServerApp (``hospitrust.server_app:app``) and the server side of a run.

``serverapp`` the Flower component (``app``); ``setup`` the run before its first round (hospitals, record,
rule); ``loop`` the rounds (FED-FBD's too); ``transport`` messages out and replies in; ``evaluation`` the new
global model's evaluation; ``discovery`` node ids -> hospitals; ``records`` per-round and per-run records;
``services`` what rules need of the server (central evaluation, the reference cohort); ``checkpoint``;
``progress`` the round in flight; ``results`` the run directory; ``story`` what the terminal says a rule did;
``plots`` the run's pictures. The server's test set and cohort are ``hospitrust.datasets.server``.
"""



def __getattr__(name: str):
    # Flower loads ``hospitrust.server_app:app``; the ServerApp is imported on first use so that
    # importing one submodule (results, checkpoint) does not import every handler.
    if name == "app":
        from hospitrust.server_app.serverapp import app

        globals()["app"] = app
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["app"]
