"""Other frameworks on convoq: one optional extra per module, never imported by the core."""
