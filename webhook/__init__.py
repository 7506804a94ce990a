"""The admission webhook (mutating + validating). Not yet implemented: see the webhook issue."""
