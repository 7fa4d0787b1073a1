"""`python -m installer` runs the same CLI as the `gpu-node-installer` console script."""

from installer.cli import main

if __name__ == "__main__":
    main()
