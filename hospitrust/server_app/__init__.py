"""The ServerApp (``hospitrust.server_app:app``) and the server side of a run.

``serverapp`` the Flower component (``app``); ``loop`` the rounds; ``discovery`` node ids -> hospitals;
``records`` per-round and per-run records; ``services`` what rules need of the server
(central evaluation, the reference cohort); ``checkpoint``; ``results`` the run directory;
``fbd`` FED-FBD's rounds over its warehouse; ``plots`` trust.png. The server's test set and cohort are
``hospitrust.datasets.server``.
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
