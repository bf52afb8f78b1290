"""(being built: see issue 10)"""
