"""DDPM training step with diffusers' UNet2DModel and DDPMScheduler (the diffusers
"train_unconditional" recipe at 128 x 128), fp16 autocast with a GradScaler."""
import torch
import torch.nn.functional as F
from diffusers import DDPMScheduler, UNet2DModel

model = UNet2DModel(
    sample_size=128, in_channels=3, out_channels=3, layers_per_block=2,
    block_out_channels=(128, 128, 256, 256, 512, 512),
    down_block_types=("DownBlock2D", "DownBlock2D", "DownBlock2D", "DownBlock2D", "AttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "AttnUpBlock2D", "UpBlock2D", "UpBlock2D", "UpBlock2D", "UpBlock2D"),
).to("cuda")
noise_scheduler = DDPMScheduler(num_train_timesteps=1000)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=1e-6)
scaler = torch.cuda.amp.GradScaler()

for step in range(2):
    clean_images = torch.randn(16, 3, 128, 128, device="cuda")
    noise = torch.randn(clean_images.shape, device=clean_images.device)
    timesteps = torch.randint(0, noise_scheduler.config.num_train_timesteps, (clean_images.shape[0],),
                              device=clean_images.device).long()
    noisy_images = noise_scheduler.add_noise(clean_images, noise, timesteps)
    with torch.autocast("cuda", dtype=torch.float16):
        noise_pred = model(noisy_images, timesteps, return_dict=False)[0]
        loss = F.mse_loss(noise_pred.float(), noise)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
