"""REINFORCE on a toy environment stepped on the host: the action is sampled on the GPU and
read with .item() every step, returns are normalised, one update per episode."""
import numpy as np
import torch
import torch.nn as nn
from torch.distributions import Categorical


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 6))

    def forward(self, x):
        return torch.softmax(self.net(x), dim=-1)


class ToyEnv:
    def reset(self):
        self.t = 0
        return np.random.randn(64).astype(np.float32)

    def step(self, action):
        self.t += 1
        return np.random.randn(64).astype(np.float32), float(action == 3), self.t >= 200


device = torch.device("cuda")
policy = Policy().to(device)
optimizer = torch.optim.Adam(policy.parameters(), lr=1e-3)
env, gamma, eps = ToyEnv(), 0.99, np.finfo(np.float32).eps.item()
for episode in range(2):
    state, log_probs, rewards, done = env.reset(), [], [], False
    while not done:
        probs = policy(torch.from_numpy(state).float().unsqueeze(0).to(device))
        m = Categorical(probs)
        action = m.sample()
        log_probs.append(m.log_prob(action))
        state, reward, done = env.step(action.item())
        rewards.append(reward)
    R, returns = 0.0, []
    for r in rewards[::-1]:
        R = r + gamma * R
        returns.insert(0, R)
    returns = torch.tensor(returns, device=device)
    returns = (returns - returns.mean()) / (returns.std() + eps)
    loss = torch.cat([-lp * R for lp, R in zip(log_probs, returns)]).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
