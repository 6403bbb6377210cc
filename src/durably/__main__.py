"""`python -m durably`: the same as the `durably` command (e.g. `python -m durably worker`)."""

from durably.cli import main

if __name__ == "__main__":
    main()
