"""Drop-in APIs of other attention packages, over kernelops ops."""
