"""Model cards and Hub publishing."""
