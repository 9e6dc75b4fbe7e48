"""The synthetic world of fictional entities (`openrealm world`) and its reading warm-up, the world's "BERT stage":
the toy on which the quickstart shows REALM's lifecycle end to end (docs/quickstart.md)."""

__all__: list[str] = []
