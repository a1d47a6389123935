"""The ClientApp (``hospitrust.client_app:app``): a hospital's side of every round.

``clientapp`` the Flower component (``app``) and its handlers; ``context`` a hospital's setup from the run
and node config; ``training`` its local training step; ``secure`` SecAgg+ train messages;
``contribution`` a hospital's counterfactuals (mods); ``fbd`` FED-FBD's ``train.fbd`` handler.
"""



def __getattr__(name: str):
    # Flower loads ``hospitrust.client_app:app``; the ClientApp is imported on first use so that
    # importing one submodule (context, training) does not import every handler.
    if name == "app":
        from hospitrust.client_app.clientapp import app

        globals()["app"] = app
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["app"]
