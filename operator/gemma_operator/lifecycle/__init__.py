"""The two lifecycles as pure functions (observed -> Decision): `finetune`, `serve`, and what they
share (`common`). The kopf handlers in `reconcile.py` do the reading and the writing."""
