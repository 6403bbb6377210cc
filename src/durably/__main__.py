"""`python -m durably`: the same as the `durably` command."""

from durably.cli import main

if __name__ == "__main__":
    main()
