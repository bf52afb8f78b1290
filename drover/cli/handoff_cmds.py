"""(being built: see issues 10 and 11)"""
