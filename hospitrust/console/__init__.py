"""The operator's console (``hospitrust console``) and the static run report (``hospitrust report RUN_DIR``).

``runs`` reads run directories as they grow; ``views`` turns their records into what is shown;
``app`` serves the page and its JSON API; ``report`` writes the same page as one file.
"""
