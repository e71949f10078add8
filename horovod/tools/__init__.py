"""Tools users run as modules: ``python -m horovod.tools.house`` (the shape of the package), ``house_picture`` (its
drawing), ``floors`` (the layer table both read) and ``scaling`` (a scaling planner).
"""
