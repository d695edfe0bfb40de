"""The contract sync: contracts from git, signature checked, compiled, signed, published."""
