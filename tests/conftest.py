from kvspec.conformance.settings import load_profile

load_profile()
