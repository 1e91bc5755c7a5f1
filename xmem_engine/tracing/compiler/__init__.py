"""``torch.compile`` on the virtual GPU: Dynamo, AOTAutograd and Inductor compiling for the
target GPU on the CPU, and what Inductor's timings allocate on the GPU.
"""
