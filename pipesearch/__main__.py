"""``python -m pipesearch`` runs the command line."""

from .cli import main

main()
