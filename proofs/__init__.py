"""CrossHair proof obligations over fixed-size models of the pool."""
